"""How well an estimate (attribution patching) finds what exact activation patching finds.

Both tables are reduced to one effect per site, the mean over pairs of patched_metric minus the base run's metric
(the corrupt run's when denoising, the clean run's when noising), and compared by rank."""

import pandas as pd

from resid.errors import ResidError


def site_effects(df: pd.DataFrame) -> pd.Series:
    """The mean effect of each site over the pairs: patched_metric - the base run's metric."""
    base = df["corrupt_metric"].where(df["direction"] == "denoise", df["clean_metric"])
    return (df["patched_metric"] - base).groupby(df["site"]).mean()


def compare(estimate: pd.DataFrame, exact: pd.DataFrame, k: int = 20) -> dict:
    """Rank agreement of two patching tables over the sites both have: Spearman's rank correlation of the mean
    effects, the share of the exact top-k sites (by |effect|) in the estimate's top-k, and those it misses (false
    negatives), largest first."""
    if set(estimate["direction"]) != set(exact["direction"]) or set(estimate["metric"]) != set(exact["metric"]):
        raise ResidError("compare needs two tables of the same direction and metric.")
    ours, truth = site_effects(estimate), site_effects(exact)
    shared = ours.index.intersection(truth.index)
    if len(shared) < 2:
        raise ResidError(f"The two tables share {len(shared)} site(s); compare needs tables over the same sites.")
    ours, truth = ours[shared], truth[shared]
    k = min(k, len(shared))
    top_truth = truth.abs().sort_values(ascending=False).index[:k]
    top_ours = set(ours.abs().sort_values(ascending=False).index[:k])
    missed = [site for site in top_truth if site not in top_ours]
    return {
        "sites": len(shared),
        "spearman": float(ours.rank().corr(truth.rank())),
        "k": k,
        "top_k_overlap": (k - len(missed)) / k,
        "false_negatives": missed,
    }
