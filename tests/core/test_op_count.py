"""How many operations a plain forward (nothing captured, nothing edited) issues per layer.

Every operation costs a dispatch on the CPU and a kernel launch on a GPU; a small batch is bound by their number,
and with a busy second core every parallel kernel waits for the thread that shares it. The count is of the aten
operations torch dispatches (a TorchDispatchMode sees each one, deterministically, on the CPU), and apart from it
of the kernels among them: what is left without the views (transpose, view, split, and _unsafe_view, the
reshape of a fresh tensor: no data touched). Per layer is
the difference between a 4-layer and a 2-layer model divided by two, which must equal that between 3 and 2 layers
(the count does not depend on the depth). The bounds are the counts reached, with a little slack, so that a
regression fails; `pytest -s` prints them.
"""

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import resid
from tests.random_models import make_random_model

# (operations, kernels) per layer at most, by (kind, dtype): the counts reached plus a little slack. Before the
# fusions (rotary, norms, 2-D projections) they were llama 67 / 36 (float32) and 75 / 44 (bfloat16), gemma the same,
# gpt2 38 / 12 and 68 / 42; now 50 / 29, 54 / 33, gemma 52 / 31 and 58 / 37, gpt2 31 / 12 in both dtypes.
BOUNDS = {
    ("llama_gqa", torch.float32): (52, 30),
    ("llama_gqa", torch.bfloat16): (56, 34),
    ("gemma_like", torch.float32): (54, 32),
    ("gemma_like", torch.bfloat16): (60, 38),
    ("gpt2_like", torch.float32): (33, 13),
    ("gpt2_like", torch.bfloat16): (33, 13),
}


class Operations(TorchDispatchMode):
    """Counts the aten operations dispatched while open, by name, and apart the views among them."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self.views = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        self.views += func.is_view or func.overloadpacket.__name__ == "_unsafe_view"
        return func(*args, **(kwargs or {}))


def counted(kind: str, n_layers: int, dtype: torch.dtype) -> Operations:
    model = make_random_model(kind, n_layers=n_layers).to(dtype)
    ids = torch.randint(0, model.config.d_vocab, (2, 16), generator=torch.Generator().manual_seed(0))
    model.run(ids, capture=resid.Capture.none())  # warm-up: anything done once per model is not counted
    with Operations() as ops:
        model.run(ids, capture=resid.Capture.none())
    return ops


@pytest.mark.parametrize(("kind", "dtype"), list(BOUNDS))
def test_operations_per_layer(kind: str, dtype: torch.dtype) -> None:
    two, three, four = (counted(kind, n, dtype) for n in (2, 3, 4))
    total = {n: sum(ops.ops.values()) for n, ops in ((2, two), (3, three), (4, four))}
    per_layer = (total[4] - total[2]) / 2
    kernels = (total[4] - four.views - total[2] + two.views) / 2
    assert per_layer == total[3] - total[2], f"the count per layer depends on the depth: {total}"
    names = sorted((four.ops - two.ops).items(), key=lambda item: -item[1])
    name = f"{kind} {str(dtype).removeprefix('torch.')}"
    print(f"\n{name}: {per_layer:.0f} operations per layer ({kernels:.0f} kernels), {total[4]} for 4 layers; per 2 "
          f"layers: {names}")
    most_ops, most_kernels = BOUNDS[kind, dtype]
    assert per_layer <= most_ops, f"{per_layer} operations per layer, more than {most_ops}: {names}"
    assert kernels <= most_kernels, f"{kernels} kernels per layer, more than {most_kernels}: {names}"
