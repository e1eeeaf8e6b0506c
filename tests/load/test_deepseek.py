"""DeepSeek V2/V3 beyond the parity every tiny variant has (tests/load/test_parity_hf.py, tests/invariants): the
routing equals transformers' routers (V2's grouped softmax, V3's bias-corrected sigmoid), the shared experts are
experts whose writes sum with the routed ones to the MLP's write, the latent is a capturable and editable field
that equals transformers' own, greedy generation through the KV cache equals transformers', more configurations
match transformers (V3's interleaved rotary with a dense first
layer and yarn, V2's greedy routing with a query latent), and the options transformers does not compute are refused
with what to do."""

import json

import pytest
import torch
from tiny_fixtures import Tiny, random_ids
from tiny_models import D_VOCAB, deepseek_config, hf_attn, hf_mlp

import resid

DEEPSEEK = pytest.mark.parametrize("tiny", ["deepseek_v2", "deepseek_v3"], indirect=True)
ATOL = 1e-4


def _hooked(tiny: Tiny, ids: torch.Tensor, modules: dict, edit=None) -> tuple[dict, torch.Tensor]:
    """transformers' logits, and the outputs of `modules` (name -> module), each replaced by edit(name, out)."""
    found = {}

    def hook(module, args, out, name):
        found[name] = out
        return None if edit is None else edit(name, out)

    handles = [module.register_forward_hook(lambda m, a, o, name=name: hook(m, a, o, name))
               for name, module in modules.items()]
    try:
        with torch.no_grad():
            logits = tiny.hf(ids).logits
    finally:
        for handle in handles:
            handle.remove()
    return found, logits


@DEEPSEEK
def test_routing_equals_transformers_router(tiny: Tiny):
    ids = random_ids(seed=3)
    config = tiny.model.config
    layers = range(config.n_dense_layers, config.n_layers)
    found, _ = _hooked(tiny, ids, {layer: hf_mlp(tiny.hf, layer).gate for layer in layers})
    run = tiny.model.run(ids, capture=resid.Capture(mlp={"router_logits", "expert_weights"}))
    routed = config.n_experts - config.n_shared_experts
    for layer in layers:
        logits, scores, chosen = found[layer]  # [token routed], [token k], [token k]
        record = run.stream.layers[layer].mlp
        torch.testing.assert_close(record.router_logits.reshape(-1, routed), logits, atol=1e-5, rtol=0)
        weights = record.expert_weights.reshape(-1, config.n_experts)
        expected = torch.zeros_like(weights[:, :routed]).scatter(-1, chosen, scores.to(weights.dtype))
        assert ((weights[:, :routed] > 0) == (expected > 0)).all()  # the same experts
        torch.testing.assert_close(weights[:, :routed], expected, atol=1e-6, rtol=0)
        assert (weights[:, routed:] == 1).all()  # the shared experts: every token, weight 1


@DEEPSEEK
def test_expert_writes_shared_ones_included_sum_to_the_mlp_write(tiny: Tiny):
    config = tiny.model.config
    run = tiny.model.run(random_ids(), capture=resid.Capture(mlp={"out", "expert_out"}))
    for layer in range(config.n_dense_layers, config.n_layers):
        record = run.stream.layers[layer].mlp
        assert record.expert_out.shape[2] == config.n_experts
        torch.testing.assert_close(record.expert_out.sum(2), record.out, atol=1e-5, rtol=0)
        shared = record.expert_out[:, :, config.n_experts - config.n_shared_experts:]
        assert (shared.abs().amax(-1) > 0).all()  # every token reads every shared expert


@DEEPSEEK
def test_the_latent_is_transformers_and_editing_it_is_editing_theirs(tiny: Tiny):
    """kv_latent is what kv_a_layernorm returns (the latent DeepSeek caches); scaling it at one layer gives the
    logits transformers gives with the same edit made by a hook on that norm."""
    ids = random_ids(seed=2)
    norms = {layer: hf_attn(tiny.hf, layer).kv_a_layernorm for layer in range(tiny.model.config.n_layers)}
    found, _ = _hooked(tiny, ids, norms)
    run = tiny.model.run(ids, capture=resid.Capture(attn={"kv_latent", "kv_norm_scale"}))
    for layer, latent in found.items():
        torch.testing.assert_close(run.stream.layers[layer].attn.kv_latent, latent, atol=1e-5, rtol=0)
        assert run.stream.layers[layer].attn.kv_norm_scale.shape == (*ids.shape, 1)
    _, expected = _hooked(tiny, ids, {1: norms[1]}, edit=lambda name, out: out * 0.5)
    edited = tiny.model.run(ids, interventions=[resid.Scale(resid.Site(1, "attn", field="kv_latent"), 0.5)])
    torch.testing.assert_close(edited.logits, expected, atol=ATOL, rtol=0)
    assert (edited.logits - run.logits).abs().max() > 1e-2


@DEEPSEEK
def test_heads_have_value_wide_z_and_sum_to_the_attention_write(tiny: Tiny):
    config = tiny.model.config
    run = tiny.model.run(random_ids(), capture=resid.Capture(attn={"z", "q", "k", "v", "out"}))
    attn, block = run.stream.layers[1].attn, tiny.model.blocks[1].attn
    assert attn.z.shape[2:] == (config.n_heads, config.d_head_v) == attn.v.shape[2:]
    assert attn.q.shape[2:] == (config.n_heads, config.d_head) == attn.k.shape[2:]
    # the rotary key is one for all heads: the keys' last rotary_dim dims agree across heads
    torch.testing.assert_close(attn.k[..., -config.rotary_dim:], attn.k[..., :1, -config.rotary_dim:].expand_as(
        attn.k[..., -config.rotary_dim:]))
    heads = torch.einsum("bphe,hed->bpd", attn.z, block.W_O)
    torch.testing.assert_close(heads, attn.out, atol=1e-5, rtol=0)
    with pytest.raises(resid.ResidError, match="no single W_K: use W_DKV"):
        block.W_K


@DEEPSEEK
def test_greedy_generation_with_the_cache_equals_transformers(tiny: Tiny):
    """The KV cache holds latent attention's keys and its narrower values."""
    ids = random_ids(seed=4)[:1, :6]
    with torch.no_grad():
        expected = tiny.hf.generate(ids, max_new_tokens=6, do_sample=False, attention_mask=torch.ones_like(ids))
    assert tiny.model.generate(ids, max_new_tokens=6).new_ids.tolist() == expected[:, 6:].tolist()


@pytest.mark.parametrize("tiny", ["deepseek_v2"], indirect=True)
def test_expert_sweeps_skip_the_dense_layer_and_equal_brute_force(tiny: Tiny):
    """sites="expert" covers the layers with experts (V2's first layer is dense), shared experts included."""
    from resid.analyses import ablation

    model, ids = tiny.model, random_ids(seed=6)[:1]
    target, baseline = 11, 22
    df = ablation.sweep(model, ids, [target], [baseline], sites="expert", method="zero")
    config = model.config
    assert df["site"].tolist() == [f"layers[1].mlp.expert[{e}]" for e in range(config.n_experts)]
    for e in (0, config.n_experts - 1):  # a routed expert, a shared one
        logits = model.run(ids, interventions=[resid.ZeroAblate(resid.Site(1, "mlp", expert=e))]).logits[0, -1]
        assert df["ablated_metric"].iloc[e] == pytest.approx((logits[target] - logits[baseline]).item(), abs=1e-4)


def _parity(folder, variant: str, **changes) -> None:
    """resid.load of a freshly built transformers model with these config changes equals it, unpadded."""
    import transformers
    from tiny_models import _reinit

    config = deepseek_config(variant, **changes)
    torch.manual_seed(7)
    hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    _reinit(hf, seed=77)
    hf.eval().save_pretrained(folder)
    ids = random_ids(seed=5)
    with torch.no_grad():
        expected = hf(ids).logits
    torch.testing.assert_close(resid.load(folder).run(ids).logits, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("variant, changes", [
    # V3 with DeepSeek's interleaved rotary pairs, a dense first layer and yarn with both mscales
    ("deepseek_v3", dict(rope_interleave=True, first_k_dense_replace=1, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "original_max_position_embeddings": 16,
        "mscale": 1.0, "mscale_all_dim": 0.8})),
    # V2 with a query latent and plain (greedy) top-k routing
    ("deepseek_v2", dict(q_lora_rank=24, topk_method="greedy", first_k_dense_replace=0)),
    # the tiny V2 itself (tests/tiny_models.py builds it on request; the architecture-wide tests run V3)
    ("deepseek_v2", {}),
])
def test_more_configurations_match_transformers(tmp_path, variant, changes):
    _parity(tmp_path / variant, variant, **changes)


REFUSED = {
    "attention_bias": (True, "attention_bias / mlp_bias true"),
    "num_key_value_heads": (2, "num_key_value_heads=2 differs from num_attention_heads=4"),
    "moe_layer_freq": (2, "moe_layer_freq=2"),
    "scoring_func": ("sigmoid", "scoring_func='sigmoid'"),
    "topk_method": ("noaux_tc", "topk_method='noaux_tc'"),
    "norm_topk_prob": (True, "norm_topk_prob true .transformers' DeepSeek V2 never renormalizes"),
    "quantization_config": ({"quant_method": "fp8"}, "config field.s. resid does not know"),
    "kv_lora_rank": (0, "kv_lora_rank must be a whole number of at least 1"),
    "qk_rope_head_dim": (8.0, "qk_rope_head_dim must be a whole number"),
    "routed_scaling_factor": (float("nan"), "routed_scaling_factor must be a finite positive number"),
    "rope_interleave": ("false", "rope_interleave must be true or false"),
}


@pytest.mark.parametrize("tiny", ["deepseek_v2"], indirect=True)
@pytest.mark.parametrize("field", sorted(REFUSED))
def test_options_transformers_does_not_compute_are_refused(tiny: Tiny, tmp_path, field):
    folder = tmp_path / "edited"
    folder.mkdir()
    for path in tiny.folder.iterdir():
        (folder / path.name).symlink_to(path)
    config = json.loads((tiny.folder / "config.json").read_text())
    value, message = REFUSED[field]
    (folder / "config.json").unlink()
    (folder / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(resid.ResidError, match=message):
        resid.load(folder)


def test_config_checks_name_the_latent_and_expert_fields():
    base = dict(architecture="x", d_model=16, n_layers=2, n_heads=2, n_kv_heads=2, d_head=8, d_mlp=8,
                d_vocab=D_VOCAB, n_ctx=32, norm="rmsnorm", norm_eps=1e-6)
    cases = [
        (dict(kv_rank=8, n_kv_heads=1), "n_kv_heads = n_heads"),
        (dict(kv_rank=8), "needs rotary positions and rotary_dim"),
        (dict(q_rank=4), "belong to latent attention"),
        (dict(n_experts=4, experts_per_token=2, router_groups=3), "must divide the 4 routed experts"),
        (dict(n_experts=4, experts_per_token=3, router_groups=2, router_topk_groups=1), "exceeds the experts"),
        (dict(n_experts=2, experts_per_token=1, n_shared_experts=2), "must leave routed experts"),
        (dict(n_dense_layers=1), "need experts"),
    ]
    for fields, message in cases:
        with pytest.raises(resid.ResidError, match=message):
            resid.ModelConfig(**{**base, **fields})


@pytest.mark.parametrize("variant", ["deepseek_v2", "deepseek_v3"])
def test_missing_fields_default_as_transformers_config_classes_define_them(variant):
    """resid's table of defaults is the installed transformers' (so the test fails if they drift)."""
    import transformers

    from resid.load.families.deepseek import DEFAULTS

    config = getattr(transformers, {"deepseek_v2": "DeepseekV2Config", "deepseek_v3": "DeepseekV3Config"}[variant])()
    assert DEFAULTS[variant] == {name: getattr(config, name) for name in DEFAULTS[variant]}


def _edited(tiny: Tiny, folder, **changes):
    """A copy of the tiny folder whose config.json has `changes` (a value of ... removes the field)."""
    folder.mkdir()
    for path in tiny.folder.iterdir():
        if path.name != "config.json":
            (folder / path.name).symlink_to(path)
    config = {**json.loads((tiny.folder / "config.json").read_text()), **changes}
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not ...}))
    return folder


@DEEPSEEK
def test_a_config_without_the_routing_fields_loads_as_transformers_loads_it(tiny: Tiny, tmp_path):
    """V3 without routed_scaling_factor and norm_topk_prob is scaled by 2.5 and renormalized in transformers (resid
    read 1.0 and false: logits off by 4-5); V2 without routed_scaling_factor is scaled by 1.0."""
    import transformers

    folder = _edited(tiny, tmp_path / "edited", routed_scaling_factor=..., norm_topk_prob=...)
    ids = random_ids(seed=8)
    with torch.no_grad():
        expected = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")(ids).logits
    torch.testing.assert_close(resid.load(folder).run(ids).logits, expected, atol=ATOL, rtol=0)


NULLS = {
    "routed_scaling_factor": (None, "routed_scaling_factor: null .a config.json without it reads transformers' "
                              "default, 1.0."),
    "norm_topk_prob": (None, "norm_topk_prob: null"),
    "n_group": (None, "n_group: null or missing .transformers has no default."),  # grouped routing needs groups
    "num_experts_per_tok": (..., "num_experts_per_tok: null or missing"),  # V2's class has no default
    "n_routed_experts": (None, "n_routed_experts: null"),
}


@pytest.mark.parametrize("tiny", ["deepseek_v2"], indirect=True)
@pytest.mark.parametrize("field", sorted(NULLS))
def test_null_routing_fields_are_refused_by_name(tiny: Tiny, tmp_path, field):
    value, message = NULLS[field]
    with pytest.raises(resid.ResidError, match=message):
        resid.load(_edited(tiny, tmp_path / "edited", **{field: value}))


@pytest.mark.parametrize("tiny", ["deepseek_v2"], indirect=True)
@pytest.mark.parametrize("field", ["kv_lora_rank", "q_lora_rank", "intermediate_size"])
def test_an_absurd_latent_size_is_refused_before_anything_is_allocated(tiny: Tiny, tmp_path, field):
    """kv_lora_rank: 10**9 was found only when its first tensor's shape was checked: after 50 s and 12 GB. (The
    tiny V2 has a dense first layer, whose width is intermediate_size.)"""
    import resource

    folder = _edited(tiny, tmp_path / "edited", **{field: 10**9})
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(resid.ResidError, match="describes a model of about .* weight values"):
        resid.load(folder)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 2**20  # KiB: not 1 GiB more at its peak
