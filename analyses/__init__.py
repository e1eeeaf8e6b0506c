"""Analyses over resid runs: pure functions (model, inputs, options) -> tidy pandas DataFrame.

    attribution    direct logit attribution to embeddings, heads / sublayers, neurons (exact, projected)
    similarity     sentence embeddings (mean pooling) and the exact attribution of their similarity
    logit_lens     the logit lens (recomputed or frozen final norm), with target rank, entropy and KL; or a tuned lens
    tuned_lens     the tuned lens: train (tuned-lens's recipe), read / write (tuned-lens's files too), evaluate
    lenses/        lens classes over the readout, translators, their files, training, evaluation
    neurons/       FFN key-value memories (Geva et al.): values, top-activating contexts, sub-updates, edits
    ablation/      layer / sublayer / head / neuron ablation sweeps (zero, mean, resample), crash-safe
    patching/      activation, path and attribution patching (exact, AtP, AtP*), compared with each other
    distributed/   executors for chunked work (sweeps, patching, corpus scans): in process, or on Ray workers
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


def __getattr__(name: str):
    # Lazy, so that importing one small module (e.g. resid.analyses.io.store in a worker) does not load them all.
    if name in _IO:
        return importlib.import_module(f"resid.analyses.io.{name}")
    raise AttributeError(f"module 'resid.analyses' has no attribute {name!r}")


__all__ = list(_IO)
