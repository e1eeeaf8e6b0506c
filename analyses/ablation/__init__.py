"""Ablation sweeps: knock out layers, sublayers, heads or neurons one at a time over many prompts and measure
what each does to a metric of the next-token prediction.

    engine   the sweep: checks, chunks on an executor (in process or Ray workers), crash-safe output
    rows     batched (prompt x ablation) rows resumed from the clean prefix: what one chunk computes
    chunks   the sweep's chunks (prompt blocks x runs of layers) and the job that computes one on any worker
    means    mean-ablation reference statistics as a reduction over chunks of reference texts
    sites    what a sweep ablates, and its signature for resuming
    values   replacement values: reference means (agnostic or per position) and resample donors
    seq2seq  encoder-decoder models (source=): sites on both stacks, encoder rows, means over the pairs
"""

from resid.analyses.ablation.engine import sweep

__all__ = ["sweep"]
