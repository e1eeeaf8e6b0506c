"""Where a workload's time goes, for bench_gpu.py: one extra call of it under torch.profiler (after the timed calls,
so the profiler's own cost never enters a timed figure) and one under tests/host_syncs.HostSyncs, summarised as a
short text table per workload and a few numbers for a record of its own.

    profiles = Profiles(Path("OUT/profiles"), device)         # Profiles(None, device): profiles nothing
    summary = profiles("smollm2-135m fp32 head DLA", lambda: attribution.direct(...))     # now
    profiles.later("head DLA", fn)      # a workload: kept until bench_gpu.py has written the workload's record,
    profiles.flush(results.add, context)        # then profiled, one {"workload": "profile", "of": label, ...} each

so that a run stopped at its time limit while profiling keeps the figures measured before.

The summary (a dict, None when profiling is off):
    wall_s       the profiled call's wall time (profiler overhead included: not a timing)
    host_s       CPU time inside torch's operators and the CUDA runtime (self times summed): the host's share
    device_s     GPU time of the kernels and copies (summed; None on the CPU)
    ops          aten operator calls
    launches     kernel launches (cudaLaunchKernel and kin in the trace; None on the CPU)
    syncs        host synchronisations in the trace: cudaStreamSynchronize, cudaDeviceSynchronize,
                 cudaEventSynchronize, synchronous cudaMemcpy, plus device-to-host copies (None on the CPU)
    host_reads   HostSyncs' count in a second extra call: values read to Python, moves to the host,
                 data-dependent shapes, on either device (each one a synchronisation on a GPU); host_read_places
                 its five most frequent places
    top          the 8 heaviest kernels (GPU) or operators (CPU, self time): name, calls, seconds, share
    file         the text table's path
"""

import re
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
from gpu_timing import sync
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))  # host_syncs.py, the one counter of syncs
from host_syncs import HostSyncs  # noqa: E402

LAUNCHES = {"cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx",
            "cudaLaunchCooperativeKernel", "cudaGraphLaunch"}
SYNCS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpy2D"}
TOP = 8


class Profiles:
    """Profiles workloads into `folder` (one text table each); a Profiles of folder None does nothing."""

    def __init__(self, folder: Path | None, device: torch.device, prefix: str = "", pending: list | None = None):
        self.folder, self.device, self.prefix = folder, device, prefix
        self.pending: list[tuple[str, str, Callable[[], object], bool]] = [] if pending is None else pending

    def under(self, prefix: str) -> "Profiles":
        """The same folder and pending list, file names and labels starting with `prefix` (e.g. model and dtype)."""
        return Profiles(self.folder, self.device, f"{self.prefix}{prefix} ", self.pending)

    def later(self, name: str, fn: Callable[[], object], grad: bool = False) -> None:
        """fn to be profiled at the next flush (nothing when profiling is off)."""
        if self.folder is not None:
            self.pending.append((name, f"{self.prefix}{name}", fn, grad))

    def flush(self, sink: Callable[[dict], None], context: dict) -> None:
        """Every pending profile taken, each given to `sink` as a record: context, workload "profile", `of` its
        name (without the prefix), the summary."""
        while self.pending:
            name, label, fn, grad = self.pending.pop(0)
            sink({**context, "workload": "profile", "of": name, **self._profile(label, fn, grad)})

    def drop(self) -> None:
        self.pending.clear()

    def __call__(self, name: str, fn: Callable[[], object], grad: bool = False) -> dict | None:
        """fn profiled (gradients on only with grad=True, as the timed calls ran it) and its table written."""
        return None if self.folder is None else self._profile(f"{self.prefix}{name}", fn, grad)

    def _profile(self, label: str, fn: Callable[[], object], grad: bool) -> dict:
        try:
            summary = summarise(fn, self.device, grad)
        except Exception as error:  # a failed profile leaves the workload's timed figures as they are
            return {"failed": f"{type(error).__name__}: {error}"}
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / (re.sub(r"[^A-Za-z0-9.]+", "-", label).strip("-") + ".txt")
        path.write_text(table(label, summary))
        return {**summary, "file": str(path)}


def summarise(fn: Callable[[], object], device: torch.device, grad: bool = False) -> dict:
    """One call of fn under torch.profiler and one under HostSyncs: the module docstring's dict."""
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync(device)
    with torch.set_grad_enabled(grad), profile(activities=activities) as prof:
        start = time.perf_counter()
        fn()
        sync(device)
        wall = time.perf_counter() - start
    with torch.set_grad_enabled(grad), HostSyncs() as reads:
        fn()
        sync(device)
    events = list(prof.events())
    host = [e for e in events if e.device_type == DeviceType.CPU]
    on_device = [e for e in events if e.device_type != DeviceType.CPU]
    out = dict(wall_s=wall, host_s=sum(e.self_cpu_time_total for e in host) / 1e6,
               device_s=sum(_us(e) for e in on_device) / 1e6 if cuda else None,
               ops=sum(e.name.startswith("aten::") for e in host),
               launches=sum(e.name in LAUNCHES for e in host) if cuda else None,
               syncs=(sum(e.name in SYNCS for e in host) + sum("DtoH" in e.name for e in on_device)) if cuda
               else None,
               host_reads=reads.count,
               host_read_places=[f"{place} x{n}" for place, n in reads.calls.most_common(5)])
    heavy: dict[str, list[float]] = defaultdict(list)
    for e in on_device if cuda else host:
        heavy[e.name].append(_us(e) if cuda else e.self_cpu_time_total)
    total = sum(sum(v) for v in heavy.values()) or 1.0
    ranked = sorted(heavy.items(), key=lambda kv: -sum(kv[1]))[:TOP]
    out["top"] = [dict(name=name, calls=len(v), seconds=sum(v) / 1e6, share=sum(v) / total) for name, v in ranked]
    return out


def _us(event) -> float:
    """A device event's duration in microseconds."""
    return event.time_range.end - event.time_range.start


def table(label: str, s: dict) -> str:
    """The summary as a short text table."""
    def num(value, unit=""):
        return "-" if value is None else (f"{value * 1e3:.2f} ms" if unit == "s" else f"{value:,}")

    lines = [f"# {label}",
             f"wall {num(s['wall_s'], 's')} (profiled, overhead included)   host {num(s['host_s'], 's')}   "
             f"device {num(s['device_s'], 's')}",
             f"aten ops {num(s['ops'])}   kernel launches {num(s['launches'])}   syncs in trace {num(s['syncs'])}   "
             f"host reads {num(s['host_reads'])}",
             "host reads at: " + (", ".join(s["host_read_places"]) or "none"),
             "", f"{'top ' + ('kernels (GPU time)' if s['device_s'] is not None else 'operators (self CPU time)'):<70}"
             f"{'calls':>7}{'time':>12}{'share':>7}"]
    for row in s["top"]:
        name = row["name"] if len(row["name"]) <= 68 else row["name"][:65] + "..."
        lines.append(f"{name:<70}{row['calls']:>7}{row['seconds'] * 1e3:>9.2f} ms{row['share']:>7.1%}")
    return "\n".join(lines) + "\n"


def brief(summary: dict | None) -> str:
    """One line of a profile for summary.md."""
    if not summary:
        return "-"
    if "failed" in summary:
        return f"profile failed: {summary['failed']}"
    parts = [f"host {summary['host_s'] * 1e3:.1f} ms"]
    if summary["device_s"] is not None:
        parts += [f"GPU {summary['device_s'] * 1e3:.1f} ms", f"{summary['launches']:,} launches",
                  f"{summary['syncs']:,} syncs"]
    parts += [f"{summary['ops']:,} ops", f"{summary['host_reads']:,} host reads"]
    top = summary["top"][0]["name"] if summary["top"] else "-"
    return ", ".join(parts) + f"; heaviest: {top[:50]}"

