"""Side-by-side timing shared by the benchmarks: cases interleaved, so drift on a shared machine hits all alike."""

import statistics
import time
from collections.abc import Callable

import torch


def interleaved(cases: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median wall time (s) of each case over `repeats` rounds, one call of every case per round, after one
    warm-up call each; gradients off."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    with torch.no_grad():
        for fn in cases.values():
            fn()
        for _ in range(repeats):
            for name, fn in cases.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}
