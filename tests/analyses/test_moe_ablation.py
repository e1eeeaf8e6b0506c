"""Ablation sweeps on a mixture of experts (tiny Mixtral): the "expert" site kind and explicit expert / expert-
neuron sites equal brute-force interventions for every method; dense models refuse sites="expert"."""

import pytest
import torch
from random_models import make_random_model
from tiny_fixtures import Tiny

import resid
from resid.analyses import ablation
from resid.analyses.metrics import metric_values
from resid.errors import ResidError
from resid.interventions import Replace, Site, ZeroAblate

MIXTRAL = pytest.mark.parametrize("tiny", ["mixtral"], indirect=True)
PROMPTS = [
    "When Mary and John went to the store, John gave a drink to",
    "When John and Mary went to the store, Mary gave a drink to",
]
TARGETS, BASELINES = [" Mary", " John"], [" John", " Mary"]
REFERENCE = ["Reference text one is here, and it is long enough to cover every position.", "More words."]
CAPTURE = resid.Capture(mlp={"out", "post", "expert_out"})


def _unit(stream, site: Site) -> torch.Tensor:
    record = stream.layers[site.layer].mlp
    if site.neuron is not None:
        return record.post[:, :, site.expert, site.neuron]
    return record.expert_out[:, :, site.expert]


def _brute_force(model, prompt_idx: int, site: Site, method: str) -> float:
    if method == "zero":
        edit = ZeroAblate(site)
    elif method == "mean":
        longest = max(len(model.tokenizer.encode(p)) for p in PROMPTS)
        values = [_unit(model.run(torch.tensor(model.tokenizer.encode(t)[:longest]), capture=CAPTURE).stream, site)[0]
                  for t in REFERENCE]
        edit = Replace(site, torch.cat(values).double().mean(0).to(model.dtype))
    else:
        donor = _unit(model.run(PROMPTS[1 - prompt_idx], capture=CAPTURE).stream, site)  # one prompt, no padding
        edit = Replace(site, donor if site.positions is None else donor[:, list(site.positions)])
    logits = model.run(PROMPTS[prompt_idx], interventions=[edit], logits_at="last").logits[:, 0]
    target, baseline = (torch.tensor(model.tokenizer.encode(t[prompt_idx], prepend_bos=False))
                        for t in (TARGETS, BASELINES))
    return metric_values("logit_diff", logits, target, baseline).item()


@MIXTRAL
@pytest.mark.parametrize("method", ["zero", "mean", "resample"])
def test_expert_sweeps_equal_brute_force(tiny: Tiny, method: str):
    model = tiny.model
    reference = {"zero": None, "mean": REFERENCE, "resample": PROMPTS[::-1]}[method]
    sites = [Site(1, "mlp", expert=2), Site(0, "mlp", expert=1, neuron=5), Site(-1, "mlp", expert=0, positions=[-1])]
    for chosen in ("expert", sites):
        df = ablation.sweep(model, PROMPTS, TARGETS, BASELINES, sites=chosen, method=method, reference=reference)
        if chosen == "expert":
            assert len(df) == 2 * model.config.n_layers * model.config.n_experts
            assert df["site"].iloc[3] == "layers[0].mlp.expert[3]" and df["expert"].iloc[3] == 3
        else:
            assert df["site"].iloc[2] == "layers[1].mlp.expert[0]@-1"
            assert df["neuron"].iloc[1] == 5 and df["expert"].iloc[1] == 1
        assert list(df.columns) == list(ablation.COLUMNS)
        for row in df.itertuples():
            expected = _brute_force(model, row.prompt_idx, Site.parse(row.site), method)
            torch.testing.assert_close(row.ablated_metric, expected, atol=1e-5, rtol=1e-5)


def test_dense_models_have_no_expert_sites(gpt2_tokenizer):
    model = make_random_model("llama_gqa", gpt2_tokenizer)
    with pytest.raises(ResidError, match="sites='expert' needs a mixture-of-experts model"):
        ablation.sweep(model, PROMPTS, TARGETS, sites="expert")
    df = ablation.sweep(model, PROMPTS, TARGETS, sites="sublayer")
    assert df["expert"].isna().all()
