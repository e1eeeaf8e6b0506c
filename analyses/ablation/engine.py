"""Ablation sweeps: knock out layers, sublayers, heads or neurons one at a time over many prompts and
measure what each does to a metric of the next-token prediction.

    df = ablation.sweep(model, prompts, targets, baselines, sites="sublayer", method="mean",
                        reference=texts, out="results.parquet")

One row per (prompt, ablation): prompt_idx, site, layer, part, head, expert, neuron, method, metric, clean_metric,
ablated_metric, delta (= ablated - clean). Methods: "zero"; "mean" (the write's mean over `reference`
texts; see ablation_values for agnostic vs per-position means); "resample" (the write from another
prompt: `reference` gives one donor prompt per prompt, else a random prompt of equal token length).

The engine stacks (prompt x ablation) rows into batched forwards that reuse the clean prefix: an
ablation at layer L starts from the clean residual entering L (model.resume) and unembeds only the last
token (resid.analyses.ablation.rows). The rows are split into chunks (resid.analyses.ablation.chunks) that an executor runs:
in process by default, or on Ray workers (`executor="ray", workers=N`; resid.analyses.distributed). With `out=` the
driver writes results chunk by chunk, atomically; re-running the same call resumes, on any executor.
"""

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import pandas as pd
from tqdm.auto import tqdm

from resid.analyses.ablation import values
from resid.analyses.ablation.chunks import SweepJob, plan
from resid.analyses.ablation.means import reference_means
from resid.analyses.ablation.sites import SiteKind, expand_sites, signature
from resid.analyses.checks import check_choice
from resid.analyses.distributed.executor import Executor, InProcess, resolve
from resid.analyses.inputs import Prompts, batch_size_for, prediction_positions, prompts as as_prompts
from resid.analyses.io.store import ResultStore
from resid.analyses.metrics import Metric, check_metric
from resid.analyses.vocab import token_ids
from resid.errors import ResidError
from resid.interventions import Site
from resid.model import Inputs, Transformer
from resid.seq2seq import EncoderDecoder

Method = Literal["zero", "mean", "resample"]
MeanPositions = Literal["agnostic", "per_position"]
KEY = ("prompt_idx", "site")
# One row per (prompt, ablation); delta = ablated_metric - clean_metric; head/expert/neuron are <NA> where they do
# not apply (expert: mixture-of-experts MLPs only).
COLUMNS = (*KEY, "layer", "part", "head", "expert", "neuron", "method", "metric", "clean_metric", "ablated_metric",
           "delta")


def sweep(
    model: Transformer | EncoderDecoder,
    prompts: Inputs,
    targets: Sequence[str | int] | str | int,
    baselines: Sequence[str | int] | str | int | None = None,
    sites: SiteKind | Sequence[Site] = "sublayer",
    method: Method = "zero",
    reference: Sequence[str] | str | Path | None = None,
    metric: Metric | Callable | None = None,
    batch_size: int | str = "auto",
    out: str | Path | None = None,
    seed: int = 0,
    mean_positions: MeanPositions = "agnostic",
    progress: bool = True,
    executor: Executor | str | None = None,
    workers: int | None = None,
) -> pd.DataFrame:
    """Run every ablation of `sites` on every prompt (texts, resid.Tokens or token ids); see the module
    docstring. Returns the columns of COLUMNS. Masked-LM models (BERT) are measured at each prompt's [MASK].
    executor: None (in process), "ray" (with `workers`), or a resid.analyses.distributed executor; results are the
    same on every executor."""
    _check_model(model)
    given = as_prompts(model, prompts)
    n = len(given)
    positions = prediction_positions(model, given, None, mask=True) if model.config.head == "mlm" else None
    target_ids = token_ids(model, targets, n, "target")
    baseline_ids = None if baselines is None else token_ids(model, baselines, n, "baseline")
    metric = metric or ("logit_diff" if baselines is not None else "target_prob")
    metric_label = check_metric(metric, baseline_ids is not None)
    check_choice(method, "method", ("zero", "mean", "resample"))
    check_choice(mean_positions, "mean_positions", ("agnostic", "per_position"))
    ablations = expand_sites(sites, model.config)
    lengths = given.tokens.lengths.tolist()
    donors = _donors(method, reference, given, model, seed)
    size = batch_size_for(model, given.tokens, batch_size)
    settings = dict(method=method, metric=metric_label, seed=seed, mean_positions=mean_positions)
    if positions is not None:
        settings["positions"] = positions
    if method == "mean" and reference is None:
        raise ResidError("method='mean' needs reference texts (a list of strings or a text file) to average over.")
    store = None
    if out is not None:
        sig = signature(model, given.record(), target_ids, baseline_ids, ablations, reference, donors, settings)
        store = ResultStore(out, KEY, sig)
    done = store.done() if store is not None else set()
    runner, owned = resolve(executor, workers)
    try:
        remote = None if isinstance(runner, InProcess) else runner.workers
        chunks = plan(n, ablations, done, size.value, model.config.n_layers, remote, runner.chunks_per_worker)
        means = {}
        per_position = mean_positions == "per_position"
        if method == "mean" and chunks:  # a finished sweep needs no means
            units = sorted({values.unit_of(s) for a in ablations for s in a.sites}, key=str)
            means = reference_means(runner, model, units, values.read_reference(reference), max(lengths),
                                    per_position, size.value, batch_size)
        job = SweepJob(given.sequences(range(n)), given.pad_token_id, target_ids, baseline_ids, donors, ablations,
                       method, metric, means, per_position, positions, batch_size)
        frames = []
        rows = sum(len(chunk.rows) for chunk in chunks)
        with tqdm(total=rows, desc=f"ablation sweep ({len(chunks)} chunks)", disable=not progress) as bar:
            for _, frame in runner.map(model, job, chunks):
                if store is not None:
                    store.write(frame)  # the driver is the only writer, whoever computed the rows
                frames.append(frame)
                bar.update(len(frame))
    finally:
        if owned:
            runner.close()
    result = store.finish() if store is not None else pd.concat(frames, ignore_index=True) if frames else None
    if result is None or result.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    order = {a.label: i for i, a in enumerate(ablations)}
    result = result.assign(_order=result["site"].map(order)).sort_values(["prompt_idx", "_order"], kind="stable")
    return result.drop(columns="_order").reset_index(drop=True)


def _check_model(model) -> None:
    """Ablation metrics read token logits of one stream: refuse, clearly, models that have neither."""
    if isinstance(model, EncoderDecoder):
        raise ResidError(
            f"ablation.sweep does not take encoder-decoder models ({model.name}) yet. Ablate with interventions, "
            "e.g. model.run(source, target, interventions=[resid.ZeroAblate(resid.Site(l, 'cross', head=h))])."
        )
    model.readout.unembed  # noqa: B018 -- raises for embedding models, saying what to read out instead


def _donors(method, reference, given: Prompts, model, seed) -> list[int] | list[list[int]] | None:
    """Resample donors: per prompt, another prompt's index, or the token ids of the given donor text."""
    if method != "resample":
        if method == "zero" and reference is not None:
            raise ResidError("reference is used by mean and resample ablation only; drop it for method='zero'.")
        return None
    lengths = given.tokens.lengths.tolist()
    if reference is None:
        return values.random_donors(lengths, seed)
    donors = values.read_reference(reference)
    if len(donors) != len(lengths):
        raise ResidError(
            f"For resample ablation, reference must give one donor prompt per prompt, in order: got {len(donors)} "
            f"donors for {len(lengths)} prompts."
        )
    donor_ids = [list(model.as_tokens(d).ids[0].tolist()) for d in donors]
    for i, (donor, ids, length) in enumerate(zip(donors, donor_ids, lengths)):
        if len(ids) != length:
            raise ResidError(f"Donor prompt {i} {donor!r} does not have the same token count as prompt {i} ({length}).")
    return donor_ids
