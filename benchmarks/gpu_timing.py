"""Timing and peak memory on either device, for bench_gpu.py: CUDA work is synchronised before a clock is read,
peak memory is torch.cuda.max_memory_allocated on a GPU and the resident-set growth (rss.py) on the CPU, and a
case that runs out of GPU memory is reported as such instead of ending the run."""

import statistics
import time
from collections.abc import Callable

import torch
from rss import PeakRSS


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


class Peak:
    """`with Peak(device) as p: ...` then p.bytes: the GPU's max_memory_allocated during the block (weights
    included), or on the CPU the growth of the resident set over its size at the start."""

    def __init__(self, device: torch.device):
        self.device, self.bytes = device, 0

    def __enter__(self) -> "Peak":
        sync(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._rss = PeakRSS().__enter__()
        return self

    def __exit__(self, *exc) -> None:
        sync(self.device)
        if self.device.type == "cuda":
            self.bytes = torch.cuda.max_memory_allocated(self.device)
        else:
            self._rss.__exit__(*exc)
            self.bytes = self._rss.growth


def once(fn: Callable[[], object], device: torch.device) -> tuple[float, object, int]:
    """(seconds, result, peak bytes) of one call."""
    with Peak(device) as peak, torch.no_grad():
        start = time.perf_counter()
        result = fn()
        sync(device)
        seconds = time.perf_counter() - start
    return seconds, result, peak.bytes


def interleaved(cases: dict[str, Callable[[], object]], repeats: int, device: torch.device
                ) -> dict[str, tuple[float, int] | str]:
    """Per case the median wall time over `repeats` interleaved rounds (one call of every case per round, after a
    warm-up call of each whose peak memory is reported) and that peak; "OOM" for a case that ran out of GPU
    memory (it is left out of the later rounds)."""
    out: dict[str, tuple[float, int] | str] = {}
    peaks: dict[str, int] = {}
    live = {}
    for name, fn in cases.items():
        try:
            peaks[name] = once(fn, device)[2]
            live[name] = fn
        except torch.cuda.OutOfMemoryError:
            out[name] = "OOM"
        free_cache(device)
    times: dict[str, list[float]] = {name: [] for name in live}
    with torch.no_grad():
        for _ in range(repeats):
            for name, fn in live.items():
                sync(device)
                start = time.perf_counter()
                fn()
                sync(device)
                times[name].append(time.perf_counter() - start)
    for name in cases:
        if name in live:
            out[name] = (statistics.median(times[name]), peaks[name])
    return out


def matmul_flops(device: torch.device, dtype: torch.dtype = torch.float32, n: int | None = None, repeats: int = 5
                 ) -> float:
    """This device's dense matrix-multiply rate in `dtype` (FLOP/s, the median of `repeats` n x n products of
    2 n^3 FLOPs each, torch's default precision settings): the ceiling of a training step's products. n: 4096 on a
    GPU, 1024 on the CPU (a fraction of a second on two cores)."""
    n = n or (4096 if device.type == "cuda" else 1024)
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=g).to(device, dtype) for _ in range(2))
    seconds, _ = interleaved({"matmul": lambda: a @ b}, repeats, device)["matmul"]
    return 2 * n**3 / seconds
