"""Whether tensors hold only finite values, cheaply: the check behind every refusal of NaN or infinite weights,
gradients and checkpoints (dictionary and lens files, training steps, saved states).

A NaN or an infinity anywhere makes a sum non-finite, so one summing pass per tensor (and one synchronisation for
all of them) answers for the usual case, where everything is finite; `isfinite` (a mask the size of the tensor,
several passes) runs only when a sum is not finite, which may also be finite values whose sum overflows."""

from collections.abc import Iterable

import torch
from torch import Tensor


def all_finite(*tensors: Tensor) -> bool:
    """Whether every value of every floating-point tensor is finite (integer tensors always are)."""
    floats = [t.detach() for t in tensors if t.is_floating_point()]
    if not floats:
        return True
    if bool(torch.isfinite(sum(t.sum() for t in floats))):
        return True
    return all(bool(torch.isfinite(t).all()) for t in floats)


def first_non_finite(named: Iterable[tuple[str, Tensor | None]]) -> str | None:
    """The name of the first tensor holding a NaN or an infinity (None entries skipped); None if there is none."""
    return next((name for name, tensor in named if tensor is not None and not all_finite(tensor)), None)
