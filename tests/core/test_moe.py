"""Sparse mixture of experts (Mixtral): the router equals transformers' on the tiny model (which experts, which
weights), the per-expert writes sum to the MLP write, expert and expert-neuron interventions equal hand-computed
edits of the write, and bad sites and absent fields are one clear error."""

import pytest
import torch
from moe_models import make_moe_model
from tiny_fixtures import Tiny, random_ids
from tiny_models import hf_mlp

import resid
from resid.errors import ResidError

MIXTRAL = pytest.mark.parametrize("tiny", ["mixtral"], indirect=True)
ALL_MOE = resid.Capture(mlp={"router_logits", "expert_weights", "post", "expert_out", "out"})


@MIXTRAL
def test_config_and_weights_are_read(tiny: Tiny):
    config, hf = tiny.model.config, tiny.hf
    assert (config.n_experts, config.experts_per_token) == (4, 2)
    mlp = tiny.model.blocks[1].mlp
    assert mlp.W_router.shape == (48, 4) and mlp.W_in.shape == (4, 48, 96) and mlp.W_out.shape == (4, 96, 48)
    # transformers 5 fuses the experts in memory: gate_up_proj [expert (gate up) d_model], down_proj
    # [expert d_model d_mlp]
    experts = hf_mlp(hf, 1).experts
    gate, up = experts.gate_up_proj.detach().chunk(2, dim=1)
    torch.testing.assert_close(mlp.W_gate, gate.transpose(1, 2), atol=0, rtol=0)
    torch.testing.assert_close(mlp.W_in, up.transpose(1, 2), atol=0, rtol=0)
    torch.testing.assert_close(mlp.W_out, experts.down_proj.detach().transpose(1, 2), atol=0, rtol=0)
    torch.testing.assert_close(mlp.W_router, hf_mlp(hf, 1).gate.weight.detach().T, atol=0, rtol=0)


@MIXTRAL
def test_routing_equals_transformers_router(tiny: Tiny):
    ids = random_ids(seed=3)
    found = {}
    hooks = [hf_mlp(tiny.hf, layer).gate.register_forward_hook(
        lambda module, args, out, layer=layer: found.__setitem__(layer, out)) for layer in range(2)]
    try:
        with torch.no_grad():
            tiny.hf(ids)
    finally:
        for hook in hooks:
            hook.remove()
    run = tiny.model.run(ids, capture=ALL_MOE)
    for layer in range(2):
        logits, scores, chosen = found[layer]  # [token expert], [token k], [token k]
        record = run.stream.layers[layer].mlp
        torch.testing.assert_close(record.router_logits.reshape(-1, 4), logits, atol=1e-5, rtol=0)
        weights = record.expert_weights.reshape(-1, 4)
        expected = torch.zeros_like(weights).scatter(-1, chosen, scores.to(weights.dtype))
        assert ((weights > 0) == (expected > 0)).all()  # the same experts
        torch.testing.assert_close(weights, expected, atol=1e-6, rtol=0)
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[0]))
        assert ((weights > 0).sum(-1) == 2).all()


@MIXTRAL
def test_expert_writes_sum_to_the_write_and_are_zero_where_not_routed(tiny: Tiny):
    run = tiny.model.run(random_ids(), capture=ALL_MOE)
    mlp = tiny.model.blocks[0].mlp
    record = run.stream.layers[0].mlp
    torch.testing.assert_close(record.expert_out.sum(2), record.out, atol=1e-6, rtol=0)
    routed = record.expert_weights > 0
    assert (record.expert_out[~routed] == 0).all() and (record.post[~routed] == 0).all()
    # expert e's write is weight_e * post_e @ W_out[e]
    expected = torch.einsum("bpe,bpei,eid->bped", record.expert_weights, record.post, mlp.W_out.detach())
    torch.testing.assert_close(record.expert_out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tiny", ["qwen2_moe"], indirect=True)
def test_gated_shared_experts_weigh_by_their_sigmoid_and_sum_to_the_write(tiny: Tiny):
    """Qwen2 MoE: the shared MLP (two shared experts here) is read by every token, weighted by one sigmoid gate."""
    run = tiny.model.run(random_ids(), capture=resid.Capture(mlp={*ALL_MOE.mlp, "normalized"}))
    mlp, record = tiny.model.blocks[1].mlp, run.stream.layers[1].mlp
    gate = torch.sigmoid(record.normalized @ mlp.W_shared_gate.detach())
    shared = record.expert_weights[..., mlp.n_routed:]
    assert shared.shape[-1] == 2 and (shared < 1).all()
    torch.testing.assert_close(shared, gate.expand_as(shared), atol=1e-6, rtol=0)
    torch.testing.assert_close(record.expert_out.sum(2), record.out, atol=1e-6, rtol=0)


@MIXTRAL
def test_capture_positions_keep_the_expert_axis(tiny: Tiny):
    capture = resid.Capture(positions=[-1, 0], mlp={"router_logits", "expert_weights", "post", "expert_out"})
    record = tiny.model.run(random_ids(), capture=capture).stream.layers[1].mlp
    assert record.post.shape == (2, 2, 4, 96) and record.expert_out.shape == (2, 2, 4, 48)
    assert record.router_logits.shape == record.expert_weights.shape == (2, 2, 4)


@MIXTRAL
def test_zero_ablating_an_expert_removes_its_write_without_renormalizing(tiny: Tiny):
    ids = random_ids()
    layer, expert = 1, 2
    clean = tiny.model.run(ids, capture=ALL_MOE)
    write = clean.stream.layers[layer].mlp.expert_out[:, :, expert]
    assert write.abs().sum() > 0  # the expert is used somewhere, so the test means something
    ablated = tiny.model.run(ids, interventions=[resid.ZeroAblate(resid.Site(layer, "mlp", expert=expert))],
                             capture=ALL_MOE)
    by_hand = tiny.model.run(ids, interventions=[resid.Add(resid.Site(layer, "mlp"), -write)])
    torch.testing.assert_close(ablated.logits, by_hand.logits, atol=1e-5, rtol=1e-5)
    record = ablated.stream.layers[layer].mlp
    assert (record.expert_out[:, :, expert] == 0).all()
    # the other experts' weights are untouched (no renormalization)
    torch.testing.assert_close(record.expert_weights, clean.stream.layers[layer].mlp.expert_weights)


@MIXTRAL
def test_expert_edits_at_prompt_relative_positions(tiny: Tiny):
    ids = random_ids(seed=1)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, :5] = False
    tokens = resid.Tokens(ids, mask, (mask.long().cumsum(-1) - 1).clamp(min=0))
    layer, expert = 0, 1
    clean = tiny.model.run(tokens, capture=ALL_MOE)
    site = resid.Site(layer, "mlp", expert=expert, positions=[0, -1])
    ablated = tiny.model.run(tokens, interventions=[resid.ZeroAblate(site)])
    at = tokens.padded_index([0, -1])
    rows = torch.arange(2)[:, None]
    removal = torch.zeros_like(clean.stream.layers[layer].mlp.out)
    removal[rows, at] = -clean.stream.layers[layer].mlp.expert_out[rows, at, expert]
    by_hand = tiny.model.run(tokens, interventions=[resid.Add(resid.Site(layer, "mlp"), removal)])
    torch.testing.assert_close(ablated.logits, by_hand.logits, atol=1e-5, rtol=1e-5)


@MIXTRAL
def test_an_expert_neuron_edit_equals_a_hand_computed_write(tiny: Tiny):
    ids = random_ids(seed=2)
    layer, neuron, value = 1, 7, 3.0
    clean = tiny.model.run(ids, capture=ALL_MOE)
    record = clean.stream.layers[layer].mlp
    expert = int(record.expert_weights[0, -1].argmax())  # routed at prompt 0's last token
    site = resid.Site(layer, "mlp", expert=expert, neuron=neuron, positions=[-1])
    edited = tiny.model.run(ids, interventions=[resid.Replace(site, torch.tensor(value))])
    weight = record.expert_weights[:, -1, expert]  # 0 where not routed: the edit changes nothing there
    delta = weight * (value - record.post[:, -1, expert, neuron])
    vector = torch.zeros_like(record.out)
    vector[:, -1] = delta[:, None] * tiny.model.blocks[layer].mlp.W_out[expert, neuron].detach()
    by_hand = tiny.model.run(ids, interventions=[resid.Add(resid.Site(layer, "mlp"), vector)])
    torch.testing.assert_close(edited.logits, by_hand.logits, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(edited.logits[0, -1], clean.logits[0, -1], atol=1e-4)


def test_expert_writes_sum_to_the_output_before_a_post_norm():
    model = make_moe_model(post_norms=True)
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(0))
    run = model.run(ids, capture=resid.Capture(mlp={"expert_out", "post_norm_scale", "out"}))
    record = run.stream.layers[1].mlp
    norm = model.blocks[1].ln_mlp_post
    written, _ = norm(record.expert_out.sum(2), record.post_norm_scale)
    torch.testing.assert_close(written, record.out, atol=1e-5, rtol=1e-5)


def test_sites_are_validated_with_clear_errors():
    moe = make_moe_model().config
    dense = resid.ModelConfig(**{**moe.to_dict(), "n_experts": 0, "experts_per_token": 0})
    with pytest.raises(ResidError, match="dense, not mixtures of experts"):
        resid.Site(0, "mlp", expert=1).resolve(dense)
    with pytest.raises(ResidError, match=r"expert 4 is out of range; the model has 4 experts \(0..3"):
        resid.Site(0, "mlp", expert=4).resolve(moe)
    with pytest.raises(ResidError, match=r"Name the expert: Site\(1, 'mlp', expert=e, neuron=3\)"):
        resid.Site(1, "mlp", neuron=3).resolve(moe)
    with pytest.raises(ResidError, match="cannot take expert"):
        resid.Site(0, "attn", expert=1)
    with pytest.raises(ResidError, match="neuron 24 is out of range"):
        resid.Site(0, "mlp", expert=1, neuron=24).resolve(moe)
    resid.Site(0, "mlp", expert=3, neuron=23).resolve(moe)
    assert resid.Site(0, "mlp", expert=3).what == "expert_out"
    assert resid.Site(0, "mlp", expert=3, neuron=2).what == "post"


def test_fields_the_mlp_lacks_do_not_exist():
    moe = make_moe_model()
    ids = torch.arange(6)[None]
    record = moe.run(ids, capture=resid.Capture.all()).stream.layers[0].mlp
    for name in ("pre", "gate"):
        with pytest.raises(ResidError, match=rf"layers\[0\].mlp.{name} does not exist: .*mixture of experts"):
            getattr(record, name)
    dense = resid.Transformer(resid.ModelConfig(**{**moe.config.to_dict(), "n_experts": 0, "experts_per_token": 0}))
    record = dense.run(ids, capture=resid.Capture.all()).stream.layers[0].mlp
    for name in ("router_logits", "expert_weights", "expert_out"):
        with pytest.raises(ResidError, match=rf"layers\[0\].mlp.{name} does not exist: .*dense"):
            getattr(record, name)
    with pytest.raises(ResidError, match="was not captured"):
        moe.run(ids).stream.layers[0].mlp.expert_out
