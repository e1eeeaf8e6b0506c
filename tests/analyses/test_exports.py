"""Every frame an analysis returns exports to every format of `tables`, and the data formats read back equal:
whatever dtypes an analysis chooses (a categorical, nullable ints, object text), a user's
`tables.export(df, "x.parquet")` works. One small random model with the GPT-2 tokenizer serves all."""

import pandas as pd
import pytest
from random_models import make_random_model

from resid.analyses import ablation, attribution, logit_lens, neurons, tables

PROMPTS = ["When Mary and John went to the store, John gave a drink to", "The Eiffel Tower is in"]


@pytest.fixture(scope="module")
def model(gpt2_tokenizer):
    return make_random_model("gpt2_like", gpt2_tokenizer)


FRAMES = {
    **{f"attribution.direct[{level}]": (lambda m, level=level: attribution.direct(
        m, PROMPTS, targets=[" Mary", " Paris"], baselines=" John", level=level)) for level in attribution.LEVELS},
    "attribution.direct[top prediction]": lambda m: attribution.direct(m, PROMPTS, level="head"),
    "logit_lens.run": lambda m: logit_lens.run(m, PROMPTS, targets=" Paris", positions="all", k=2),
    "logit_lens.run[own top]": lambda m: logit_lens.run(m, PROMPTS, every="layer", k=2),
    "neurons.value_top_tokens": lambda m: neurons.value_top_tokens(m, layers=[0], k=3),
    "neurons.top_activating": lambda m: neurons.top_activating(m, PROMPTS, layers=[0], neurons=[1, 2], k=2),
    "neurons.sub_updates": lambda m: neurons.sub_updates(m, PROMPTS[1], layers=[0, -1], k=3, target=" Paris"),
    "neurons.prediction_change": lambda m: neurons.prediction_change(
        m, PROMPTS, neurons.scale_coefficients(m, PROMPTS, [(0, 1), (2, 5)], 0.0, positions=[-1]), k=3),
    "ablation.sweep": lambda m: ablation.sweep(m, PROMPTS, [" Mary", " Paris"], [" John", " London"],
                                               sites="head", method="mean", reference=PROMPTS),
}


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_every_analysis_frame_exports_to_every_format(model, tmp_path, name):
    df = FRAMES[name](model)
    assert len(df) > 0
    for suffix in tables.SUFFIXES:
        path = tables.export(df, tmp_path / f"frame{suffix}")
        assert path.stat().st_size > 0 and path.with_name(path.name + ".json").exists()
        if suffix in (".csv", ".parquet"):
            back = tables.read(path)
            pd.testing.assert_frame_equal(back, df)
            analysis = df.attrs.get("provenance", {}).get("analysis")  # ablation.sweep records none (yet)
            assert back.attrs["provenance"].get("analysis") == analysis
        else:
            header = path.read_text(encoding="utf-8").splitlines()[2 if suffix == ".tex" else 0]
            assert header.replace("\\_", "_").count("_") >= sum(c.count("_") for c in df.columns)
            assert all(c.split("_")[0] in header for c in df.columns)  # every column is in the header
