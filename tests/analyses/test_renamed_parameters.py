"""Renamed parameters keep their old keyword for one release: the same table, with a DeprecationWarning that names
the new keyword; giving both is one error. (`targets` / `baselines`: one token for all prompts or one per prompt;
`position`: one prompt-relative position, `positions` several.)"""

import pandas as pd
import pytest
from random_models import make_random_model

from resid.analyses import attribution, logit_lens, neurons
from resid.errors import ResidError

PROMPTS = ["The quick brown fox jumps over the lazy", "Hello there"]


@pytest.fixture(scope="module")
def model(gpt2_tokenizer):
    return make_random_model("llama_gqa", gpt2_tokenizer)


@pytest.mark.parametrize("call, new, old", [
    (attribution.direct, {"targets": " dog", "baselines": " cat", "position": -2},
     {"target": " dog", "baseline": " cat", "pos": -2}),
    (logit_lens.run, {"targets": [" dog", " cat"]}, {"target": [" dog", " cat"]}),
])
def test_old_keywords_give_the_same_table_with_a_warning(model, call, new, old):
    expected = call(model, PROMPTS, **new)
    with pytest.warns(DeprecationWarning) as warned:
        got = call(model, PROMPTS, **old)
    named = " ".join(str(w.message) for w in warned)
    assert all(f"use {name}" in named for name in new), named
    pd.testing.assert_frame_equal(got, expected)


def test_sub_updates_takes_position(model):
    expected = neurons.sub_updates(model, PROMPTS[0], position=3, layers=[0], k=2)
    with pytest.warns(DeprecationWarning, match="pos is deprecated .* use position"):
        got = neurons.sub_updates(model, PROMPTS[0], pos=3, layers=[0], k=2)
    pd.testing.assert_frame_equal(got, expected)
    assert (got["pos"] == 3).all()  # the column keeps the tables' name


def test_old_and_new_keyword_together_are_refused(model):
    with pytest.raises(ResidError, match="target is the old name of targets: give targets only"):
        attribution.direct(model, PROMPTS, targets=" dog", target=" cat")
