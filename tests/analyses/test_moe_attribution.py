"""Direct attribution of mixture-of-experts models: rows sum to the logit at every level (tiny Mixtral and a
random MoE with post-norms), an expert's row is its weighted write read along the logit direction, and its
(expert, neuron) rows sum to it."""

import pytest
import torch
from moe_models import make_moe_model
from tiny_fixtures import Tiny

import resid
from resid.analyses import attribution

MIXTRAL = pytest.mark.parametrize("tiny", ["mixtral", "deepseek_v3"], indirect=True)
PROMPTS = ["The quick brown fox jumps over the lazy", "Hello there"]
IDS = torch.randint(0, 97, (3, 10), generator=torch.Generator().manual_seed(4))


def _assert_complete(df, rel=1e-5):
    sums = df.groupby("prompt_idx").agg(total=("value", "sum"), logit=("logit", "first"))
    err = ((sums["total"] - sums["logit"]).abs() / sums["logit"].abs().clip(lower=1.0)).max()
    assert err < rel, sums


@MIXTRAL
@pytest.mark.parametrize("level", attribution.LEVELS)
def test_rows_sum_to_the_logit(tiny: Tiny, level):
    _assert_complete(attribution.direct(tiny.model, PROMPTS, targets=" the", level=level))
    _assert_complete(attribution.direct(tiny.model, PROMPTS, targets=" the", baselines=" a", level=level, position=2))


@pytest.mark.parametrize("post_norms", [False, True])
@pytest.mark.parametrize("level", attribution.LEVELS)
def test_rows_sum_to_the_logit_on_a_random_moe(post_norms, level):
    _assert_complete(attribution.direct(make_moe_model(post_norms), IDS, targets=5, level=level))


@MIXTRAL
def test_expert_rows_are_weighted_expert_writes_along_the_direction(tiny: Tiny):
    model, target = tiny.model, " the"
    df = attribution.direct(model, PROMPTS, targets=target, level="head")
    config = model.config
    mlp_rows = df[(df["part"] == "mlp") & (df["prompt_idx"] == 0)]
    assert len(mlp_rows) == config.n_layers * config.n_experts
    assert mlp_rows["expert"].tolist() == list(range(config.n_experts)) * config.n_layers
    assert mlp_rows["site"].iloc[1] == "layers[0].mlp.expert[1]" and mlp_rows["neuron"].isna().all()
    assert df[df["part"] == "attn"]["expert"].isna().all()

    run = model.run(PROMPTS, capture=resid.Capture(mlp={"expert_out"}), logits_at="last")
    direction = model.readout.logit_direction([model.to_single_token(target)] * 2,
                                              run.stream.final_norm_scale[:, -1]).vector
    rows = df.set_index(["prompt_idx", "site"])["value"]
    last = run.tokens.last_positions()
    for layer in range(config.n_layers):
        writes = run.stream.layers[layer].mlp.expert_out[torch.arange(2), last]  # [batch expert d_model]
        expected = torch.einsum("bed,bd->be", writes.double(), direction.double())
        for b in range(2):
            got = [rows[(b, f"layers[{layer}].mlp.expert[{e}]")] for e in range(config.n_experts)]
            torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), expected[b], atol=1e-5, rtol=1e-5)
            unused = run.stream.layers[layer].mlp.expert_out[b, last[b]].abs().sum(-1) == 0
            assert all(got[e] == 0 for e in unused.nonzero()[:, 0].tolist())  # not routed: exactly 0


@MIXTRAL
def test_neuron_rows_sum_to_their_expert_row(tiny: Tiny):
    model = tiny.model
    head = attribution.direct(model, PROMPTS, targets=" the", level="head")
    neuron = attribution.direct(model, PROMPTS, targets=" the", level="neuron")
    mlp = neuron[neuron["part"] == "mlp"]
    assert len(mlp) == 2 * model.config.n_layers * model.config.n_experts * model.config.d_mlp
    assert mlp["site"].iloc[model.config.d_mlp + 1] == "layers[0].mlp.expert[1].neuron[1]"
    summed = mlp.groupby(["prompt_idx", "layer", "expert"])["value"].sum()
    experts = head[head["part"] == "mlp"].set_index(["prompt_idx", "layer", "expert"])["value"]
    torch.testing.assert_close(torch.tensor(summed.sort_index().values), torch.tensor(experts.sort_index().values),
                               atol=1e-5, rtol=1e-5)
    assert list(neuron.columns) == list(attribution.COLUMNS)
