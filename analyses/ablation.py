"""Ablation sweeps: knock out layers, sublayers, heads or neurons one at a time over many prompts and
measure what each does to a metric of the next-token prediction.

    df = ablation.sweep(model, prompts, targets, baselines, sites="sublayer", method="mean", reference=texts,
                        execution=Execution(out="results.parquet"))

One row per (prompt, site): prompt_idx, site (Site.label), layer, part, head, kv_head, expert, neuron, method,
metric, clean_metric, ablated_metric, delta (= ablated - clean). Methods: "zero"; "mean" (the site's mean over
`reference` texts; see resid.analyses.sweeps.values for agnostic vs per-position means); "resample" (the site's
value on another prompt: `reference` gives one donor prompt per prompt, else a random prompt of equal token length).

A sweep is a job of the intervention-sweep engine (resid.analyses.sweeps): (prompt x site) rows in batched
forwards that reuse the clean prefix, an ablation at layer L starting from the clean residual entering L
(model.resume) and unembedding only the last token, run by the one driver (resid.analyses.distributed.driver).
How it runs is one value, `execution=` (resid.analyses.Execution): in process by default or on Ray workers
(executor="ray", workers=N), batch_size prompts per forward pass ("auto"), a progress bar (on a terminal by
default), and with `out=` a result store written chunk by chunk, atomically: re-running the same call resumes, on
any executor.
"""

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import pandas as pd

from resid.analyses import site_words
from resid.analyses.checks import check_choice
from resid.analyses.distributed.driver import drive
from resid.analyses.distributed.execution import Execution, as_execution
from resid.analyses.inputs import Prompts, Sources, batch_size_for, check_sources, decoder_of, prediction_positions
from resid.analyses.inputs import prompts as as_prompts
from resid.analyses.metrics import Metric, check_metric
from resid.analyses.sweeps import seq2seq, values
from resid.analyses.sweeps.chunks import SweepJob, dictionaries_digest
from resid.analyses.vocab import token_ids
from resid.errors import ResidError, param, python_only
from resid.model import Inputs, Transformer
from resid.seq2seq import EncoderDecoder
from resid.sites import Site

Method = Literal["zero", "mean", "resample"]
MeanPositions = Literal["agnostic", "per_position"]
# One row per (prompt, site); delta = ablated_metric - clean_metric; head/kv_head/expert/neuron are <NA> where they
# do not apply (expert: mixture-of-experts MLPs only).
COLUMNS = ("prompt_idx", "site", *site_words.COLUMNS, "method", "metric", "clean_metric", "ablated_metric", "delta")


def sweep(
    model: Transformer | EncoderDecoder,
    prompts: Inputs,
    targets: Sequence[str | int] | str | int,
    baselines: Sequence[str | int] | str | int | None = None,
    sites: str | Sequence[Site | str] = "sublayer",
    method: Method = "zero",
    reference: Sequence[str] | str | Path | None = None,
    metric: Metric | Callable | None = None,
    seed: int = 0,
    mean_positions: MeanPositions = "agnostic",
    dictionaries: Sequence = (),
    source: Inputs | None = None,
    execution: Execution | None = None,
) -> pd.DataFrame:
    """Run every ablation of `sites` (a word of resid.analyses.site_words, or a list of resid.Site or their labels)
    on every prompt (texts, resid.Tokens or token ids); see the module docstring. Returns the columns of
    COLUMNS. Masked-LM models (BERT) are measured at each prompt's [MASK]. execution: how the sweep runs
    (resid.analyses.Execution: executor, workers, batch_size, progress, out); the rows are the same on every
    executor. dictionaries: learned dictionaries (resid.dictionaries) whose features the sites name, Site(l, part,
    feature=i): a feature is ablated inside its dictionary's splice (resid.dictionaries.edits).
    source: encoder-decoder models (resid.EncoderDecoder) only, one source per prompt (the prompts are then the
    decoder's target prefixes); sites are on both stacks (encoder sites labelled "encoder.<label>"), see
    resid.analyses.sweeps.seq2seq."""
    execution = as_execution(execution)
    full, (model, sources) = model, decoder_of(model, source)
    _check_model(model)
    given = as_prompts(model, prompts)
    n = len(given)
    check_sources(sources, n)
    read_at = prediction_positions(model, given, None, mask=True) if model.config.head == "mlm" else None
    target_ids = token_ids(model, targets, n, "target")
    baseline_ids = None if baselines is None else token_ids(model, baselines, n, "baseline")
    metric = metric or ("logit_diff" if baselines is not None else "target_prob")
    metric_label = check_metric(metric, baseline_ids is not None)
    check_choice(method, "method", ("zero", "mean", "resample"))
    check_choice(mean_positions, "mean_positions", ("agnostic", "per_position"))
    lengths = given.tokens.lengths.tolist()
    if sources is not None:
        return _sweep_pairs(full, given, sources, target_ids, baseline_ids, sites, method, reference, metric, seed,
                            mean_positions, dictionaries, execution)
    chosen = site_words.expand(sites, model.config, max(lengths))
    donors = _donors(method, reference, given, model, seed)
    if method == "mean" and reference is None:
        raise ResidError(f"{param('method', 'mean')} needs reference texts to average over: give "
                         f"{param('reference')} ({python_only('a list of texts, or ')}a .txt or .jsonl file).")
    size = batch_size_for(model, given.tokens, execution.batch_size)
    dictionaries = tuple(getattr(d, "dictionary", d) for d in dictionaries)
    settings = dict(analysis="ablation.sweep", metric=metric_label, seed=seed, mean_positions=mean_positions,
                    reference=_digest(reference), dictionaries=dictionaries_digest(dictionaries))
    reference_texts = values.read_reference(reference) if method == "mean" else None
    job = SweepJob(given.sequences(range(n)), given.pad_token_id, target_ids, baseline_ids, donors, chosen, method,
                   metric, {}, mean_positions == "per_position", read_at, execution.batch_size, size.value,
                   model.config.n_layers, settings, reference=reference_texts, dictionaries=dictionaries)
    return _ordered(drive(model, job, execution), chosen)


def _sweep_pairs(model: EncoderDecoder, given: Prompts, sources: Sources, target_ids, baseline_ids, sites, method,
                 reference, metric, seed, mean_positions, dictionaries, execution: Execution) -> pd.DataFrame:
    """The sweep of an encoder-decoder model over (source, target prefix) pairs (resid.analyses.sweeps.seq2seq)."""
    if dictionaries:
        raise ResidError(f"{param('dictionaries')} are not taken with encoder-decoder models yet.")
    seq2seq.in_process(execution.executor)
    if reference is not None and method != "resample":
        raise ResidError(f"{param('reference')}: encoder-decoder sweeps take no reference texts (mean ablation "
                         "averages over the pairs themselves); drop it.")
    n, lengths = len(given), given.tokens.lengths.tolist()
    source_lengths = sources.prompts.tokens.lengths.tolist()
    chosen = seq2seq.expand(model, sites, max(lengths), max(source_lengths))
    donors = seq2seq.donors(lengths, source_lengths, seed, reference) if method == "resample" else None
    size = batch_size_for(model.decoder, given.tokens, execution.batch_size)
    source_ids = seq2seq.SourceIds(sources.prompts.sequences(range(n)), sources.prompts.pad_token_id)
    settings = dict(analysis="ablation.sweep", metric=check_metric(metric, baseline_ids is not None), seed=seed,
                    mean_positions=mean_positions)
    job = SweepJob(given.sequences(range(n)), given.pad_token_id, target_ids, baseline_ids, donors, chosen, method,
                   metric, {}, mean_positions == "per_position", None, execution.batch_size, size.value,
                   model.config.n_layers, settings, sources=source_ids, encoder_layers=model.encoder.config.n_layers)
    return _ordered(drive(model, job, execution), chosen)


def _ordered(result: pd.DataFrame | None, chosen: list[Site]) -> pd.DataFrame:
    """The rows in prompt order, then in the order of the sites."""
    if result is None or result.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    order = {site.label: i for i, site in enumerate(chosen)}
    result = result.assign(_order=result["site"].map(order)).sort_values(["prompt_idx", "_order"], kind="stable")
    return result.drop(columns="_order").reset_index(drop=True)


def _digest(reference) -> object:
    """What the signature records of the reference: a file's content hash, the texts themselves, or None."""
    if isinstance(reference, (str, Path)) and Path(reference).is_file():
        return hashlib.sha256(Path(reference).read_bytes()).hexdigest()
    return reference if reference is None or isinstance(reference, str) else list(reference)


def _check_model(model) -> None:
    """Ablation metrics read token logits of one stream: refuse, clearly, models that have neither."""
    model.readout.unembed  # noqa: B018 -- raises for embedding models, saying what to read out instead


def _donors(method, reference, given: Prompts, model, seed) -> list[int] | list[list[int]] | None:
    """Resample donors: per prompt, another prompt's index, or the token ids of the given donor text."""
    if method != "resample":
        if method == "zero" and reference is not None:
            raise ResidError(f"{param('reference')} is used by mean and resample ablation only; drop it for "
                             f"{param('method', 'zero')}.")
        return None
    lengths = given.tokens.lengths.tolist()
    if reference is None:
        return values.random_donors(lengths, seed)
    donors = values.read_reference(reference)
    if len(donors) != len(lengths):
        raise ResidError(
            f"For resample ablation, {param('reference')} must give one donor prompt per prompt, in order: got "
            f"{len(donors)} "
            f"donors for {len(lengths)} prompts."
        )
    donor_ids = [list(model.as_tokens(d).ids[0].tolist()) for d in donors]
    for i, (donor, ids, length) in enumerate(zip(donors, donor_ids, lengths)):
        if len(ids) != length:
            raise ResidError(f"Donor prompt {i} {donor!r} does not have the same token count as prompt {i} ({length}).")
    return donor_ids
