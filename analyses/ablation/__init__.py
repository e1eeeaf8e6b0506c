"""Ablation sweeps: knock out layers, sublayers, heads or neurons one at a time over many prompts and measure
what each does to a metric of the next-token prediction.

    engine   the sweep: batched (prompt x ablation) rows resumed from the clean prefix, crash-safe output
    sites    what a sweep ablates, and its signature for resuming
    values   replacement values: reference means (agnostic or per position) and resample donors
"""

from analyses.ablation.engine import sweep

__all__ = ["sweep"]
