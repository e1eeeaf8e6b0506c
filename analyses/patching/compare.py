"""How well an estimate (attribution patching) finds what exact activation patching finds.

Both tables are reduced to one effect per site, the mean over pairs of patched_metric minus the base run's metric
(the corrupt run's when denoising, the clean run's when noising), and compared by rank. An AtP* table, whose
`magnitude` column estimates each effect's size and not its sign, is ranked by its mean magnitude against the size
of the exact effects."""

import pandas as pd

from resid.errors import ResidError


def site_effects(df: pd.DataFrame) -> pd.Series:
    """The mean effect of each site over the pairs: patched_metric - the base run's metric."""
    base = df["corrupt_metric"].where(df["direction"] == "denoise", df["clean_metric"])
    return (df["patched_metric"] - base).groupby(df["site"]).mean()


def compare(estimate: pd.DataFrame, exact: pd.DataFrame, k: int = 20, by: str = "auto") -> dict:
    """Rank agreement of two patching tables over the sites both have: Spearman's rank correlation of the mean
    effects, the share of the exact top-k sites (by |effect|) in the estimate's top-k, and those it misses (false
    negatives), largest first. by="effect" ranks the estimate by its mean effect; by="magnitude" by its mean
    `magnitude` column, against |exact effect| (the Spearman correlation then compares sizes); "auto" takes the
    magnitude for AtP* tables (method="atp*"), the effect otherwise."""
    if set(estimate["direction"]) != set(exact["direction"]) or set(estimate["metric"]) != set(exact["metric"]):
        raise ResidError("compare needs two tables of the same direction and metric.")
    if by not in ("auto", "effect", "magnitude"):
        raise ResidError(f"by must be 'auto', 'effect' or 'magnitude', got {by!r}.")
    if by == "magnitude" and "magnitude" not in estimate:
        raise ResidError("by='magnitude' needs an estimate with a magnitude column (resid.analyses.patching.atp).")
    if by == "auto":
        starred = "method" in estimate and (estimate["method"] == "atp*").any()
        by = "magnitude" if starred else "effect"
    truth = site_effects(exact)
    ours = estimate["magnitude"].groupby(estimate["site"]).mean() if by == "magnitude" else site_effects(estimate)
    shared = ours.index.intersection(truth.index)
    if len(shared) < 2:
        raise ResidError(f"The two tables share {len(shared)} site(s); compare needs tables over the same sites.")
    ours, truth = ours[shared], truth[shared]
    if by == "magnitude":
        truth = truth.abs()
    k = min(k, len(shared))
    top_truth = truth.abs().sort_values(ascending=False).index[:k]
    top_ours = set(ours.abs().sort_values(ascending=False).index[:k])
    missed = [site for site in top_truth if site not in top_ours]
    return {
        "sites": len(shared),
        "ranked_by": by,
        "spearman": float(ours.rank().corr(truth.rank())),
        "k": k,
        "top_k_overlap": (k - len(missed)) / k,
        "false_negatives": missed,
    }
