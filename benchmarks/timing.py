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


def matmul_gflops(n: int = 2048, repeats: int = 5, dtype: torch.dtype = torch.float32) -> float:
    """This machine's dense matrix-multiply rate (GFLOP/s, median of `repeats` n x n products, 2 n^3 FLOPs each):
    the ceiling a forward pass, which is mostly such products, can approach. The README's "165 GFLOP/s in fp32"
    is this figure on the machine bench_train.py ran on."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    seconds = interleaved({"matmul": lambda: a @ b}, repeats)["matmul"]
    return 2 * n**3 / seconds / 1e9
