"""patching.path's default direction became "denoise" (it was "noise", Wang et al.'s convention, which answers the
opposite question): a call that relies on the default is told so by a FutureWarning saying how to get either."""

import warnings

import pandas as pd
import pytest

from resid.analyses import patching
from resid.sites import Site

CLEAN = ["The quick brown fox jumps over the lazy dog"]
CORRUPT = ["The quick brown cat jumps over the lazy dog"]
SENDERS = [Site(0, "attn", head=1)]
PAIRS = patching.Pairs(CLEAN, CORRUPT, 11, 42)


@pytest.mark.parametrize("random_model", ["llama_gqa"], indirect=True)
def test_path_without_a_direction_warns_and_patches_denoise(random_model):
    with pytest.warns(FutureWarning, match=r"no direction, so it patches direction='denoise' .* since resid 0\.1\.0"
                      r"\. Before 0\.1\.0 path's default was 'noise' .* pass direction='noise' for that"):
        default = patching.path(random_model, PAIRS, senders=SENDERS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an explicit direction is not warned about
        denoise = patching.path(random_model, PAIRS, senders=SENDERS, direction="denoise")
        noise = patching.path(random_model, PAIRS, senders=SENDERS, direction="noise")
    pd.testing.assert_frame_equal(default, denoise)
    assert default["direction"].tolist() == ["denoise"] and noise["direction"].tolist() == ["noise"]
    assert (default["patched_metric"] - noise["patched_metric"]).abs().max() > 1e-4  # the two questions differ
