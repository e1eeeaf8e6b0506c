"""Activation patching (exact): run one prompt of a (clean, corrupt) pair, put the other prompt's activation in at
one site, and measure how much of the clean behaviour that restores.

    direction="denoise"  run the corrupt prompt, patch in the clean activation (what is sufficient)
    direction="noise"    run the clean prompt, patch in the corrupt activation (what is necessary)

score = (patched - corrupt) / (clean - corrupt): 0 is the corrupt run's metric, 1 the clean run's, in both
directions. Sites (resid.analyses.patching.selection): a word of resid.analyses.site_words ("resid_pre", "resid_mid",
"resid_post": the residual stream at each layer and each position, the layer x position map; "sublayer", "head",
"layer", "q", "k", "v", "pattern"), "feature" (with `dictionaries=`: every feature of the learned dictionaries
active in some prompt of a pair; resid.analyses.patching.features), or a list of words, resid.Site values and
their labels (feature sites Site(l, part, feature=i) included). Each site is given the other prompt's activation
by the intervention-sweep engine's resample path (resid.analyses.sweeps: batched rows, the clean prefix reused,
the last token unembedded, out-of-memory back-off), and the clean and corrupt metrics come from the same clean
passes.

How it runs is one value, `execution=` (resid.analyses.Execution): chunks of rows on the one driver
(resid.analyses.distributed.driver), in process or on Ray workers (executor="ray", workers=N) with the same rows,
batch_size pairs per forward pass, a progress bar (on a terminal by default), and with `out=` (a .parquet or .csv
file) finished rows stored chunk by chunk: a killed run, called again the same way, resumes where it stopped. The
file holds the engine's rows (ablated_metric is the patched metric, clean_metric the base run's, donor_metric the
donor run's); the returned frame has the columns of COLUMNS.

The pairs must have the same token length (the positions correspond one to one), or, for residual sites, an
alignment (align="end" or explicit positions; resid.analyses.patching.pairs); positions are the clean prompt's.
"""

from collections.abc import Callable, Sequence

import pandas as pd

from resid.analyses import site_words
from resid.analyses.distributed.driver import drive
from resid.analyses.distributed.execution import Execution, as_execution
from resid.analyses.inputs import batch_size_for
from resid.analyses.patching import selection
from resid.analyses.patching.features import WORD, active, patched_dictionaries, require
from resid.analyses.patching.pairs import (
    Align,
    Pairs,
    PatchDirection,
    PromptPairs,
    n_prompts,
    pairs_of,
    prepare,
    scored,
)
from resid.analyses.patching.sources import pair_sources
from resid.analyses.sweeps import seq2seq
from resid.analyses.sweeps.chunks import SweepJob, dictionaries_digest
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
    pairs: Pairs | Inputs,
    corrupt: Inputs | None = None,
    targets: Sequence[str | int] | str | int | None = None,
    baselines: Sequence[str | int] | str | int | None = None,
    sites: str | Sequence[Site | str] = "resid_pre",
    direction: PatchDirection = "denoise",
    metric: str | Callable | None = None,
    align: Align = None,
    dictionaries: Sequence = (),
    source: Inputs | None = None,
    corrupt_source: Inputs | None = None,
    execution: Execution | None = None,
) -> pd.DataFrame:
    """Exact activation patching of every site on every (clean, corrupt) pair of `pairs` (a patching.Pairs: prompts,
    targets, baselines, metric, alignment); the columns of COLUMNS (the parameters and their defaults:
    resid.analyses.patching). The old separate arguments (clean prompts here, then corrupt, targets, baselines,
    metric=, align=) still work for one release, with a DeprecationWarning. execution: how it runs
    (resid.analyses.Execution: executor, workers, batch_size, progress, out); the same rows on every executor.
    dictionaries: learned dictionaries (resid.dictionaries) whose features the sites name.
    source, corrupt_source: encoder-decoder models only, each clean / corrupt prompt's source
    (resid.analyses.patching.sources); sites are then on both stacks (encoder sites "encoder.<label>")."""
    given = pairs_of(pairs, "patching.activation", corrupt=corrupt, targets=targets, baselines=baselines, metric=metric,
                     align=align)
    execution = as_execution(execution)
    full, (model, sources) = model, pair_sources(model, source, corrupt_source, n_prompts(given.clean))
    if sources is not None and (dictionaries or WORD in selection.words(sites)):
        raise ResidError(f"{param('dictionaries')} are not taken with encoder-decoder models yet.")
    if sources is not None:
        seq2seq.in_process(execution.executor)
    dictionaries = patched_dictionaries(dictionaries, sites)
    pairs, target_ids, baseline_ids, metric, label = prepare(model, given, direction)
    base, donor = ("corrupt", "clean") if direction == "denoise" else ("clean", "corrupt")
    size = batch_size_for(model, pairs.clean.tokens, execution.batch_size)
    width = int(pairs.clean.tokens.lengths.max())
    if sources is not None:
        source_width = int(sources.clean.tokens.lengths.max())
        chosen = selection.expand(sites, lambda word: seq2seq.expand(full, word, width, source_width),
                                  lambda listed: seq2seq.expand(full, listed, width, source_width))
        sources.check(chosen)
    else:
        def word(name: str) -> list[Site]:
            if name != WORD:
                return site_words.expand(name, model.config, width)
            pairs.require_same_positions(f"Patching {param('sites', WORD)}")
            return active(model, pairs, dictionaries, size.value)

        chosen = selection.expand(sites, word, lambda listed: site_words.expand(listed, model.config, width))
        require(chosen, dictionaries)
    if not chosen:  # "feature" alone, and no feature active in any pair
        return pd.DataFrame(columns=list(COLUMNS))
    if any((site.part not in RESID_PARTS or site.positions is None) and site.stack is None for site in chosen):
        pairs.require_same_positions(f"Patching {param('sites', sites)}" if isinstance(sites, str)
                                     else "Patching Sites")
    settings = dict(analysis="patching.activation", direction=direction, metric=label,
                    **({"dictionaries": dictionaries_digest(dictionaries)} if dictionaries else {}))
    base_prompts = getattr(pairs, base)
    job = SweepJob(pairs.ids[base], base_prompts.pad_token_id, target_ids, baseline_ids,
                   pairs.ids[donor], chosen, "resample", metric, {}, False, None,
                   execution.batch_size, size.value, model.config.n_layers, settings,
                   aligned=named_positions(pairs, base), donor_metric=True, dictionaries=dictionaries,
                   sources=None if sources is None else sources.ids(base, donor),
                   encoder_layers=0 if sources is None else full.encoder.config.n_layers)
    df = drive(full, job, execution)
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




def named_positions(pairs: PromptPairs, base: str) -> list[dict[int, tuple[int, int]]] | None:
    """Per pair, {clean position: (base position, donor position)} (None for pairs patched position for
    position): tables name positions by the clean prompt, whichever prompt is the base."""
    if pairs.same_positions:
        return None
    out = []
    for row in range(len(pairs.clean)):
        mine = pairs.positions(base, row)  # (base position, donor position)
        out.append({(ours if base == "clean" else theirs): (ours, theirs) for ours, theirs in mine})
    return out
