"""Counting host synchronisations on the CPU: every place where code asks the device for a value, or for a shape that
depends on the values, so that a hot path's count can be checked without a GPU.

On a GPU each of these waits for every queued kernel to finish (the host needs the answer), so a path that makes one
per dictionary, layer or row serialises the device. On the CPU they cost nothing, which is why they creep in; this
counts them through torch's own override mechanism (a TorchFunctionMode sees every tensor method and function call),
without replacing anything of torch.

    with HostSyncs() as syncs:
        model.run(...)
    syncs.count          # how many
    syncs.where()        # "resid/dictionaries/attach.py:239 __bool__ x3, ..." for a failing assertion's message

What counts: reading a value to Python (`item`, `tolist`, `bool` / `int` / `float` / `index` of a tensor, `numpy`),
moving to the host (`cpu`; `to(device)` is not counted: on a CPU it cannot tell the host from the
model's device), and operations whose output shape depends on the values (`nonzero`,
one-argument `where`, `masked_select`, `unique`, indexing with a boolean mask, `repeat_interleave` by a tensor of
repeats, `bincount`).
"""

import collections
import traceback
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

ROOT = Path(__file__).resolve().parents[1]
# always a synchronisation (a value to Python, or a data-dependent shape)
_ALWAYS = frozenset({
    "item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu", "nonzero", "masked_select",
    "unique", "unique_consecutive", "bincount", "argwhere",
})


def _is_sync(func, args: tuple, kwargs: dict) -> bool:
    name = getattr(func, "__name__", "")
    if name in _ALWAYS:
        return True
    if name == "where":  # where(condition) alone is nonzero
        return len(args) + len(kwargs) == 1
    if name == "__getitem__":  # x[mask]: the result's length is the mask's count
        index = args[1] if len(args) > 1 else None
        items = index if isinstance(index, tuple) else (index,)
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)
    if name == "repeat_interleave":
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
        return isinstance(repeats, torch.Tensor) and repeats.numel() > 1
    return False


class HostSyncs(TorchFunctionMode):
    """Counts host synchronisations (see the module docstring) made while the context is open, with where each came
    from (the innermost frame inside this repository)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter[str] = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _is_sync(func, args, kwargs):
            self.calls[f"{_caller()} {getattr(func, '__name__', func)}"] += 1
        return func(*args, **kwargs)

    @property
    def count(self) -> int:
        return sum(self.calls.values())

    def where(self) -> str:
        return ", ".join(f"{place} x{n}" for place, n in self.calls.most_common()) or "none"


def _caller() -> str:
    """file:line of the innermost frame in this repository's code outside this file (resid, analyses, benchmarks)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = Path(frame.filename)
        if path.is_relative_to(ROOT) and path.name != "host_syncs.py" and "tests" not in path.parts:
            return f"{path.relative_to(ROOT)}:{frame.lineno}"
    return "outside resid"
