"""Activation patching (exact): run one prompt of a (clean, corrupt) pair, put the other prompt's activation in at
one site, and measure how much of the clean behaviour that restores.

    direction="denoise"  run the corrupt prompt, patch in the clean activation (what is sufficient)
    direction="noise"    run the clean prompt, patch in the corrupt activation (what is necessary)

score = (patched - corrupt) / (clean - corrupt): 0 is the corrupt run's metric, 1 the clean run's, in both
directions. Sites: a word of resid.analyses.sites ("resid_pre", "resid_mid", "resid_post": the residual stream at
each layer and each position, the layer x position map; "sublayer", "head", "layer", "q", "k", "v", "pattern"),
"feature" (with `dictionaries=`: every feature of the learned dictionaries active in some prompt of a pair;
resid.analyses.patching.features) or a list of resid.Site (or their labels, feature sites Site(l, part, feature=i)
included): each is given the other prompt's activation by the ablation engine's resample path
(resid.analyses.ablation: batched rows, the clean prefix reused, the last token unembedded, out-of-memory
back-off), and the clean and corrupt metrics come from the same clean passes.

With `out=` (a .parquet or .csv file) finished rows are stored chunk by chunk by the one driver
(resid.analyses.distributed.driver): a killed run, called again the same way, resumes where it stopped. Chunks run
in process, or on Ray workers (executor="ray", workers=N), with the same rows. The file holds the engine's rows
(ablated_metric is the patched metric, clean_metric the base run's, donor_metric the donor run's); the returned
frame has the columns of COLUMNS.

The pairs must have the same token length (the positions correspond one to one), or, for residual sites, an
alignment (align="end" or explicit positions; resid.analyses.patching.pairs); positions are the clean prompt's.
"""

from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from resid.analyses import sites as site_words
from resid.analyses.ablation import seq2seq
from resid.analyses.ablation.chunks import SweepJob
from resid.analyses.ablation.engine import dictionaries_digest
from resid.analyses.distributed.driver import drive
from resid.analyses.distributed.execution import Execution
from resid.analyses.distributed.executor import Executor
from resid.analyses.inputs import batch_size_for
from resid.analyses.patching.features import WORD, active, dictionaries_of, require
from resid.analyses.patching.pairs import Align, Pairs, PatchDirection, prepare, scored
from resid.analyses.patching.sources import pair_sources
from resid.errors import ResidError, param
from resid.model import Inputs, Transformer
from resid.seq2seq import EncoderDecoder
from resid.sites import RESID_PARTS, Site

# One row per (pair, site); patched_metric is the metric with the site patched, score its normalized value;
# position: the clean prompt's position of a residual site of the layer x position map (<NA> otherwise).
COLUMNS = ("prompt_idx", "site", *site_words.COLUMNS, "position", "direction", "metric", "clean_metric",
           "corrupt_metric", "patched_metric", "score")


def activation(
    model: Transformer | EncoderDecoder,
    clean: Sequence[str],
    corrupt: Sequence[str],
    targets: Sequence[str | int] | str | int,
    baselines: Sequence[str | int] | str | int | None = None,
    sites: str | Sequence[Site | str] = "resid_pre",
    direction: PatchDirection = "denoise",
    metric: str | Callable | None = None,
    batch_size: int | str = "auto",
    out: str | Path | None = None,
    progress: bool = False,
    align: Align = None,
    executor: Executor | str | None = None,
    workers: int | None = None,
    dictionaries: Sequence = (),
    source: Inputs | None = None,
    corrupt_source: Inputs | None = None,
) -> pd.DataFrame:
    """Exact activation patching of every site on every (clean, corrupt) pair; the columns of COLUMNS. executor:
    None (in process), "ray" (with `workers`) or a resid.analyses.distributed executor: the same rows on each.
    dictionaries: learned dictionaries (resid.dictionaries) whose features the sites name.
    source, corrupt_source: encoder-decoder models only, each clean / corrupt prompt's source
    (resid.analyses.patching.sources); sites are then on both stacks (encoder sites "encoder.<label>")."""
    full, (model, sources) = model, pair_sources(model, source, corrupt_source, _count(clean))
    if sources is not None and (dictionaries or sites == WORD):
        raise ResidError(f"{param('dictionaries')} are not taken with encoder-decoder models yet.")
    if sources is not None:
        seq2seq.in_process(executor)
    dictionaries = dictionaries_of(dictionaries, sites)
    pairs, target_ids, baseline_ids, metric, label = prepare(model, clean, corrupt, targets, baselines, metric,
                                                              direction, align)
    base, donor = ("corrupt", "clean") if direction == "denoise" else ("clean", "corrupt")
    n = len(pairs.clean)
    size = batch_size_for(model, pairs.clean.tokens, batch_size)
    if sites == WORD:
        pairs.require_same_positions(f"Patching {param('sites', sites)}")
        chosen = active(model, pairs, dictionaries, size.value)
        if not chosen:
            return pd.DataFrame(columns=list(COLUMNS))
    elif sources is not None:
        chosen = seq2seq.expand(full, sites, int(pairs.clean.tokens.lengths.max()),
                                int(sources.clean.tokens.lengths.max()))
        sources.check(chosen)
    else:
        chosen = site_words.expand(sites, model.config, int(pairs.clean.tokens.lengths.max()))
        require(chosen, dictionaries)
    if any((site.part not in RESID_PARTS or site.positions is None) and site.stack is None for site in chosen):
        pairs.require_same_positions(f"Patching {param('sites', sites)}" if isinstance(sites, str)
                                     else "Patching Sites")
    settings = dict(analysis="patching.activation", direction=direction, metric=label,
                    **({"dictionaries": dictionaries_digest(dictionaries)} if dictionaries else {}))
    base_prompts = getattr(pairs, base)
    job = SweepJob(base_prompts.sequences(range(n)), base_prompts.pad_token_id, target_ids, baseline_ids,
                   getattr(pairs, donor).sequences(range(n)), chosen, "resample", metric, {}, False, None, batch_size,
                   size.value, model.config.n_layers, settings, aligned=named_positions(pairs, base),
                   donor_metric=True, dictionaries=dictionaries,
                   sources=None if sources is None else sources.ids(base, donor),
                   encoder_layers=0 if sources is None else full.encoder.config.n_layers)
    df = drive(full, job, Execution(executor, workers, batch_size, progress, out))
    if df is None or df.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    df = df.rename(columns={"ablated_metric": "patched_metric"})
    base_metric, donor_metric = df["clean_metric"].to_numpy(), df["donor_metric"].to_numpy()
    df["clean_metric"], df["corrupt_metric"] = (donor_metric, base_metric) if base == "corrupt" else (
        base_metric, donor_metric)
    positions = {site.label: site_words.position(site) for site in chosen}
    df["position"] = pd.array(df["site"].map(positions).tolist(), dtype="Int64")
    order = {site.label: i for i, site in enumerate(chosen)}
    df = df.assign(_order=df["site"].map(order)).sort_values(["prompt_idx", "_order"], kind="stable")
    return scored(df, direction, label)[list(COLUMNS)].reset_index(drop=True)


def _count(prompts) -> int:
    return 1 if isinstance(prompts, str) else len(prompts)


def named_positions(pairs: Pairs, base: str) -> list[dict[int, tuple[int, int]]] | None:
    """Per pair, {clean position: (base position, donor position)} (None for pairs patched position for
    position): tables name positions by the clean prompt, whichever prompt is the base."""
    if pairs.same_positions:
        return None
    out = []
    for row in range(len(pairs.clean)):
        mine = pairs.positions(base, row)  # (base position, donor position)
        out.append({(ours if base == "clean" else theirs): (ours, theirs) for ours, theirs in mine})
    return out
