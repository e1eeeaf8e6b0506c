"""resid.finite: the cheap sum answers only when it is finite; a NaN, an infinity, or finite values whose sum
overflows go to the exact check, which is right in every case."""

import torch

from resid.finite import all_finite, first_non_finite


def test_all_finite_is_exact_whatever_the_sum_says() -> None:
    ok = torch.randn(4, 5)
    assert all_finite(ok, ok.double()) and all_finite(torch.arange(5)) and all_finite()
    for bad in (float("nan"), float("inf"), -float("inf")):
        broken = ok.clone()
        broken[2, 3] = bad
        assert not all_finite(broken) and not all_finite(ok, broken)
    huge = torch.full((4,), 3e38)  # finite values whose float32 sum overflows to inf
    assert not bool(torch.isfinite(huge.sum())) and all_finite(huge)


def test_first_non_finite_names_the_first_in_order() -> None:
    nan = torch.tensor([1.0, float("nan")])
    assert first_non_finite([("a", torch.ones(2)), ("b", None), ("c", nan), ("d", nan)]) == "c"
    assert first_non_finite([("a", torch.ones(2))]) is None
