"""attribution.direct with a Probe target: any linear read-out of the final hidden state decomposes exactly,
like a logit; a probe equal to an unembedding column gives that logit's attribution."""

import pytest
import torch
from tiny_fixtures import Tiny

import resid
from resid.analyses import attribution
from resid.analyses.attribution import Probe
from resid.analyses.vocab import single_token_id

PROMPTS = ["The quick brown fox jumps over the", "Hello"]


def _hidden(model, text: str) -> torch.Tensor:
    """The final hidden state (final norm's output) at the last token, computed by hand."""
    run = model.run(text)
    return model.readout.normalize(run.stream.final())[0][0, -1].float().detach()


@pytest.mark.parametrize("level", ["sublayer", "head", "neuron"])
def test_probe_rows_sum_to_the_read_out_on_every_family(tiny: Tiny, level):
    model = tiny.model
    vector = torch.randn(model.config.d_model, generator=torch.Generator().manual_seed(3))
    df = attribution.direct(model, PROMPTS, targets=Probe(vector, bias=0.5, name="random"), level=level)
    for i, text in enumerate(PROMPTS):
        rows = df[df.prompt_idx == i]
        expected = float(_hidden(model, text) @ vector) + 0.5
        assert rows["readout"].iloc[0] == pytest.approx(expected, rel=1e-5, abs=1e-5)
        assert rows["value"].sum() == pytest.approx(expected, rel=1e-5, abs=1e-5)
    assert set(df["target"]) == {"random"} and (df["target_id"] == -1).all()
    assert attribution.metric_name(df) == "probe 'random'"


def test_an_unembedding_column_probe_equals_the_logit_attribution(random_model):
    target = single_token_id(random_model, " the")
    column = random_model.unembed.W_U[:, target].detach()
    bias = 0.0 if random_model.unembed.b_U is None else float(random_model.unembed.b_U[target].detach())
    probe = attribution.direct(random_model, PROMPTS, targets=Probe(column, bias), level="head")
    logit = attribution.direct(random_model, PROMPTS, targets=" the", level="head")
    torch.testing.assert_close(torch.tensor(probe["value"].values), torch.tensor(logit["value"].values),
                               atol=1e-5, rtol=1e-5)
    assert list(probe["site"]) == list(logit["site"])


def test_one_vector_per_prompt(random_model):
    vectors = torch.randn(2, random_model.config.d_model, generator=torch.Generator().manual_seed(4))
    both = attribution.direct(random_model, PROMPTS, targets=Probe(vectors))
    for i, text in enumerate(PROMPTS):
        alone = attribution.direct(random_model, text, targets=Probe(vectors[i]))
        torch.testing.assert_close(torch.tensor(both[both.prompt_idx == i]["value"].values),
                                   torch.tensor(alone["value"].values), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("probe, baseline, message", [
    (Probe(torch.zeros(3)), None, r"shape \[d_model\]"),
    (None, " a", "takes no baseline"),
])
def test_bad_probes_are_explained(random_model, probe, baseline, message):
    probe = probe if probe is not None else Probe(torch.zeros(random_model.config.d_model))
    with pytest.raises(resid.ResidError, match=message):
        attribution.direct(random_model, PROMPTS, targets=probe, baselines=baseline)
