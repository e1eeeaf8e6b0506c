"""Analyses over resid runs: pure functions (model, inputs, options) -> tidy pandas DataFrame.

    attribution    direct logit attribution to embeddings, heads / sublayers, neurons (exact, projected)
    similarity     sentence embeddings (mean pooling) and the exact attribution of their similarity
    lenses/        every lens in one home: the logit lens, the tuned lens (train, tuned-lens's files), the J-lens
                   (the expected Jacobian: fit, TransformerLens's files), per-site predictions, evaluation, figures,
                   interventions in a lens's coordinates. `logit_lens` (lenses.predictions: `logit_lens.run`) and
                   `tuned_lens` (the lenses package) are reachable by those names too
    neurons/       FFN key-value memories (Geva et al.): values, top-activating contexts, sub-updates, edits
    ablation       layer / sublayer / head / neuron ablation sweeps (zero, mean, resample), crash-safe
    patching/      activation, path and attribution patching (exact, AtP, AtP*), compared with each other
    sweeps/        the intervention-sweep engine ablation and exact patching run on: batched (prompt x site) rows
                   from the clean prefix, the chunked job, replacement values, reference means, encoder-decoders
    corpus_windows a corpus cut into token windows and padded batches (scans, dictionary training, evaluation)
    distributed/   the one driver of long jobs and its executors: in process, or on Ray workers
    Execution      how a long job runs, one value (executor, workers, batch_size, progress, out):
                   `from resid.analyses import Execution`; every sweep, patching method, scan and mean takes
                   execution=Execution(...) (resid.analyses.distributed.execution)
    io/            tables (CSV / Parquet / LaTeX / Markdown), the crash-safe result store, provenance,
                   prompt and corpus files, one atomic write
    inputs         what every analysis accepts (texts, Tokens, ids), tokenized once; prompt-relative positions
    vocab          targets and baselines as single token ids; token ids decoded for tables
    checks         shared argument checks (layers, neurons, counts)
    metrics        scalar metrics of a next-token prediction
    plots          plotly figures of the DataFrames
    cli/           the `resid` command (the top layer: nothing below imports it)

Layers: resid <- resid.analyses <- resid.analyses.cli; nothing here is imported by the core. The folder is
analyses/ in the repository and installs as resid.analyses (pyproject.toml).
"""

import importlib

# RESID_TYPECHECK=1: resid/__init__.py installs the runtime type checks for every resid.* module, these included
# (the parent package is imported first).
_IO = ("corpus", "provenance", "tables")  # io modules also reachable as `from resid.analyses import tables`
# The names the lenses had before they had one home, kept for the scripts and notebooks that use them.
_LENSES = {"logit_lens": "resid.analyses.lenses.predictions", "tuned_lens": "resid.analyses.lenses"}


def __getattr__(name: str):
    # Lazy, so that importing one small module (e.g. resid.analyses.io.store in a worker) does not load them all.
    if name in _IO:
        return importlib.import_module(f"resid.analyses.io.{name}")
    if name in _LENSES:
        return importlib.import_module(_LENSES[name])
    if name == "Execution":
        return importlib.import_module("resid.analyses.distributed.execution").Execution
    raise AttributeError(f"module 'resid.analyses' has no attribute {name!r}")


__all__ = [*_IO, *_LENSES, "Execution"]
