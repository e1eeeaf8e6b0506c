"""Batching for large sweeps: chunking, an automatic batch size per device, and out-of-memory back-off.

`run_batched(items, work, size)` calls `work(chunk)` on consecutive chunks of `items`. A CUDA
out-of-memory error halves `size` (a shared BatchSize, so later calls start from the size that fit) and
retries the same chunk: no item is lost or done twice. Results come back in order, chunk by chunk, for the
caller to persist as they arrive.
"""

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from resid.errors import ResidError, param
from resid.model import Transformer

Item = TypeVar("Item")
Result = TypeVar("Result")

CPU_TOKENS_PER_BATCH = 4096  # enough rows to amortize per-call overhead without growing the working set
MAX_BATCH = 1024  # rows per forward pass: at most this on the CPU, at least this limit on an accelerator
# An accelerator's forward pass of short rows is bound by its kernel launches, not by its multiply-adds: its rows
# are limited by tokens (and by memory), so that 15-token prompts go thousands to a pass, not MAX_BATCH.
ACCELERATOR_TOKENS_PER_BATCH = 1 << 16


@dataclass
class BatchSize:
    """Rows per forward pass; shrinks on out-of-memory and stays shrunk for the rest of the sweep."""

    value: int

    def __post_init__(self) -> None:
        if not isinstance(self.value, int) or self.value < 1:
            raise ResidError(f"{param('batch_size')} must be a positive integer or 'auto', got {self.value!r}.")

    def halve(self) -> None:
        if self.value == 1:
            raise ResidError(
                "Out of GPU memory even with a batch of one row: use shorter prompts, a smaller model, "
                f"{param('dtype', torch.bfloat16)}, or run on the CPU ({param('device', 'cpu')})."
            )
        self.value = max(1, self.value // 2)


def cuda_free_bytes(device: torch.device) -> int:
    """Memory this process can still allocate on a CUDA `device`: the driver's free memory plus what PyTorch's
    caching allocator holds without using (freed tensors it keeps for reuse, which mem_get_info counts as taken)."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def host_available_bytes() -> int | None:
    """Memory the host can still give this process: the least of Linux's MemAvailable (free memory plus the caches
    it could drop) less the file pages this process maps (a memory-mapped model's weights are cache the kernel
    counts as droppable, but dropping them would only read them back), and what the process's own limits leave
    (memory_limits: an address-space limit, a cgroup's memory limit); None where none of them is known."""
    available = _proc_field("/proc/meminfo", "MemAvailable:")
    if available is not None:
        available = max(0, available - (_proc_field("/proc/self/status", "RssFile:") or 0))
    known = [left for left in (available, *memory_limits()) if left is not None]
    return min(known) if known else None


def memory_limits() -> tuple[int | None, int | None]:
    """What this process's limits leave it, in bytes (None: no limit, or not known): (1) the address space under
    RLIMIT_AS (ulimit -v) less the address space it maps now, memory-mapped files included (a mapped file takes
    address space whether or not its pages are read); (2) the memory under its cgroup's limit (v2 memory.max, v1
    memory.limit_in_bytes) less the cgroup's usage, page cache it could drop excepted. Either limit, where set, is
    what makes an allocation past it fail (a MemoryError, or the cgroup's out-of-memory killer) while the host's
    MemAvailable still looks ample."""
    return _address_space_left(), _cgroup_left()


def _address_space_left() -> int | None:
    try:
        import resource
    except ImportError:  # not a Unix
        return None
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    mapped = _proc_field("/proc/self/status", "VmSize:")
    if limit == resource.RLIM_INFINITY or mapped is None:
        return None
    return max(0, limit - mapped)


def _cgroup_left() -> int | None:
    """The least that the limits of this process's cgroup and of the groups above it leave (v2), or its v1 memory
    controller's; inactive page cache counts as free (the kernel drops it before it fails an allocation)."""
    lefts = []
    for folder, limit_file, usage_file, cache_field in _cgroup_folders():
        limit, usage = _read_int(f"{folder}/{limit_file}"), _read_int(f"{folder}/{usage_file}")
        if limit is not None and usage is not None and limit < 2**60:  # v1 writes "no limit" as about 2**63
            cache = _stat_field(f"{folder}/memory.stat", cache_field) or 0
            lefts.append(max(0, limit - usage + cache))
    return min(lefts) if lefts else None


def _cgroup_folders() -> list[tuple[str, str, str, str]]:
    """(folder, limit file, usage file, memory.stat's inactive cache field) of each cgroup whose memory limit
    binds this process: /proc/self/cgroup's v2 group and its ancestors, or its v1 memory group."""
    root, found = "/sys/fs/cgroup", []
    try:
        with open("/proc/self/cgroup") as handle:
            lines = [line.strip().split(":", 2) for line in handle if line.count(":") >= 2]
    except OSError:
        lines = []
    for _, controllers, path in lines:
        if controllers == "":  # v2: "0::/path"
            parts = [p for p in path.split("/") if p and p != ".."]
            found += [(f"{root}/{'/'.join(parts[:n])}".rstrip("/"), "memory.max", "memory.current", "inactive_file")
                      for n in range(len(parts), -1, -1)]
        elif "memory" in controllers.split(","):
            found.append((f"{root}/memory{path}".rstrip("/"), "memory.limit_in_bytes", "memory.usage_in_bytes",
                          "total_inactive_file"))
    # in a container the group's own files are usually at the root of the mount, whatever the path says
    found += [(root, "memory.max", "memory.current", "inactive_file"),
              (f"{root}/memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")]
    return list(dict.fromkeys(found))


def _read_int(path: str) -> int | None:
    """A file holding one integer (cgroup's "max", meaning no limit, reads as None)."""
    try:
        with open(path) as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


def _stat_field(path: str, field: str) -> int | None:
    """A "name value" line of a cgroup memory.stat file (in bytes)."""
    try:
        with open(path) as handle:
            for line in handle:
                name, _, value = line.partition(" ")
                if name == field:
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def _proc_field(path: str, field: str) -> int | None:
    """A "Name: value kB" line of a /proc file, in bytes."""
    try:
        with open(path) as handle:
            for line in handle:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_bytes(device: torch.device) -> int | None:
    """Memory new tensors on `device` can take: cuda_free_bytes on a GPU, host_available_bytes on the CPU (None
    where unknown: another accelerator, or a host that does not say)."""
    if device.type == "cuda":
        return cuda_free_bytes(device)
    return host_available_bytes() if device.type == "cpu" else None


def model_batch_size(model: Transformer, n_pos: int, kept_bytes_per_row: int = 0, backward: bool = False) -> int:
    """A first guess at rows per forward pass of `model` on sequences of `n_pos` tokens: at most half the device's
    available memory for the forward's working set, and at most CPU_TOKENS_PER_BATCH tokens on the CPU (MAX_BATCH
    rows at most), ACCELERATOR_TOKENS_PER_BATCH on any other device (MAX_BATCH rows at least); the OOM back-off
    corrects it on CUDA. `kept_bytes_per_row`: what a caller holds per row beyond the forward's working
    set (e.g. captured activations of many layers), which may take at most a quarter of it. backward: the pass is
    differentiated, so autograd keeps every layer's working set until the backward pass. The estimate counts eager
    attention's scores, which SDPA kernels need not hold, so a row it says is too large still runs alone."""
    n_pos = max(n_pos, 1)
    cfg = model.config
    # Working set of one row: residual-width activations, the MLP hidden, attention scores, one logit row.
    layer = n_pos * (8 * cfg.d_model + 4 * cfg.d_mlp + 2 * cfg.n_heads * n_pos)
    per_row = model.dtype.itemsize * (layer * (cfg.n_layers if backward else 1) + 2 * cfg.d_vocab)
    if model.device.type == "cpu":
        limit = min(MAX_BATCH, max(1, CPU_TOKENS_PER_BATCH // n_pos))
    else:
        limit = max(MAX_BATCH, ACCELERATOR_TOKENS_PER_BATCH // n_pos)
    free = available_bytes(model.device)
    if free is None:
        return limit
    rows = int(0.5 * free // per_row)
    if kept_bytes_per_row:
        rows = min(rows, int(0.25 * free // kept_bytes_per_row))
    return max(1, min(limit, rows))


def with_backoff(work: Callable[[int], Result], size: BatchSize) -> Result:
    """work(size.value), halving the size and retrying on CUDA out-of-memory."""
    while True:
        try:
            return work(size.value)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            size.halve()


def run_batched(
    items: Sequence[Item],
    work: Callable[[Sequence[Item]], Result],
    size: BatchSize,
    on_progress: Callable[[int], None] | None = None,
) -> Iterator[tuple[Sequence[Item], Result]]:
    """Yield (chunk, work(chunk)) over `items` in order, halving the chunk size on CUDA out-of-memory."""
    start = 0
    while start < len(items):
        chunk, result = with_backoff(lambda n: (items[start : start + n], work(items[start : start + n])), size)
        start += len(chunk)
        if on_progress is not None:
            on_progress(len(chunk))
        yield chunk, result
