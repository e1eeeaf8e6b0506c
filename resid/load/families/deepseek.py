"""DeepSeek V2 and V3 (DeepSeek-AI 2024, "DeepSeek-V2" and "DeepSeek-V3"): Llama's norms and embeddings with
multi-head latent attention (resid.components.latent) and DeepSeekMoE MLPs (resid.components.moe): the first
first_k_dense_replace layers dense (intermediate_size), the others n_routed_experts routed experts plus
n_shared_experts shared ones (moe_intermediate_size each).

How the two versions route (as transformers 5 does; resid.config's router_* fields):
    V2  softmax scores; topk_method "greedy" (plain top-k) or "group_limited_greedy" (n_group groups scored by
        their best expert, the topk_group best kept); the chosen scores times routed_scaling_factor, never
        renormalized (transformers' V2 ignores norm_topk_prob, so resid refuses norm_topk_prob true rather than
        guess which reading the checkpoint meant)
    V3  sigmoid scores plus e_score_correction_bias to choose (not to weigh); groups scored by the sum of their two
        best; the chosen scores renormalized if norm_topk_prob, times routed_scaling_factor ("noaux_tc")

Traps: the shared experts are one MLP of n_shared_experts * moe_intermediate_size neurons in the checkpoint;
resid splits it by rows into n_shared_experts experts of moe_intermediate_size (the same sum). kv_a_proj_with_mqa
fuses the latent's projection and the shared rotary key's ([kv_lora_rank + qk_rope_head_dim, d_model]) and
kv_b_proj each head's no-rope key and value ([head (qk_nope_head_dim + v_head_dim), kv_lora_rank]): both are loaded
fused, as the component stores them. head_dim in config.json is qk_rope_head_dim (the rotary's width, as
transformers sets it), not the head's width. The softmax scale is (qk_nope + qk_rope)^-0.5, times yarn's
mscale(factor, mscale_all_dim)^2 for scaled rotaries. Real V3 checkpoints carry a multi-token-prediction layer after
the last (model.layers.61), which transformers skips and so does this table.
"""

import math

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.load.families import ROPE_CONFIG_FIELDS, Family, Rope, activation, context, rope
from resid.load.weights import Key, per_layer

FIELDS = ROPE_CONFIG_FIELDS | {
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "qk_head_dim",
    "intermediate_size", "moe_intermediate_size", "vocab_size", "rms_norm_eps", "attention_bias", "mlp_bias",
    "hidden_act", "tie_word_embeddings", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
    "v_head_dim", "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "first_k_dense_replace",
    "moe_layer_freq", "n_group", "topk_group", "topk_method", "norm_topk_prob", "routed_scaling_factor",
    "scoring_func", "rope_interleave",
    # training and parallelism only: the auxiliary balance loss, expert parallelism, the multi-token-prediction
    # module after the last layer (its weights are skipped, as transformers skips them)
    "aux_loss_alpha", "seq_aux", "ep_size", "num_nextn_predict_layers",
}
VERSIONS = {"deepseek_v2": ("softmax", ("greedy", "group_limited_greedy")), "deepseek_v3": ("sigmoid", ("noaux_tc",))}
# What a config.json without the field means: the defaults of transformers' DeepseekV2Config and DeepseekV3Config
# (what transformers computes for it; tests/load/test_deepseek.py reads them from the installed classes). V3's differ
# from V2's: its routing weights are renormalized and scaled by 2.5, its first 3 layers dense. The sizes
# (hidden_size, kv_lora_rank, ...) have no default here: a config.json without one is refused as incomplete.
DEFAULTS = {
    "deepseek_v2": {
        "routed_scaling_factor": 1.0, "norm_topk_prob": False, "topk_method": "greedy", "n_group": None,
        "topk_group": None, "n_shared_experts": 2, "first_k_dense_replace": 0, "num_experts_per_tok": None,
        "q_lora_rank": 1536, "hidden_act": "silu", "tie_word_embeddings": False, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 2048,
    },
    "deepseek_v3": {
        "routed_scaling_factor": 2.5, "norm_topk_prob": True, "n_group": 8, "topk_group": 4, "n_shared_experts": 1,
        "first_k_dense_replace": 3, "num_experts_per_tok": 8, "q_lora_rank": 1536, "hidden_act": "silu",
        "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "rope_interleave": True, "max_position_embeddings": 4096,
    },
}
# Fields read as numbers or switches, which a null leaves undefined (transformers fails on most, or reads a null
# norm_topk_prob as false where V3's default is true): refused by name. q_lora_rank null means no query latent, and
# n_group / topk_group null mean no groups where the routing has none (V2's greedy).
NOT_NULL = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "moe_intermediate_size",
    "vocab_size", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
    "n_shared_experts", "num_experts_per_tok", "first_k_dense_replace", "routed_scaling_factor", "norm_topk_prob",
    "topk_method", "hidden_act", "tie_word_embeddings", "rms_norm_eps", "rope_interleave", "max_position_embeddings",
)


def config_from_hf(hf: dict) -> ModelConfig:
    model_type = hf["model_type"]
    scores, methods = VERSIONS[model_type]
    hf = {**DEFAULTS[model_type], **hf}
    _refuse_nulls(hf, model_type, methods)
    _refuse(hf, model_type, scores, methods)
    n_heads = hf["num_attention_heads"]
    nope, rot = hf["qk_nope_head_dim"], hf["qk_rope_head_dim"]
    rotary = rope(hf)
    method = hf.get("topk_method", methods[0])  # V3 has no topk_method: its one method
    grouped = method != "greedy"
    d_head, shared = nope + rot, hf["n_shared_experts"]
    return ModelConfig(
        architecture=model_type,
        d_model=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=n_heads,  # every head reads its own keys and values off the latent
        d_head=d_head,
        d_mlp=hf["moe_intermediate_size"],
        d_vocab=hf["vocab_size"],
        n_ctx=context(hf, rotary),
        norm="rmsnorm",
        norm_eps=hf["rms_norm_eps"],
        positions="rotary",
        rotary_dim=rot,
        rotary_base=rotary.base,
        rope_scaling=rotary.scaling,
        attn_scale=d_head**-0.5 * _mscale(hf, rotary) ** 2,
        act=activation(hf["hidden_act"]),
        tie_embeddings=hf["tie_word_embeddings"],
        n_experts=hf["n_routed_experts"] + shared,
        experts_per_token=hf["num_experts_per_tok"],
        n_shared_experts=shared,
        n_dense_layers=min(hf["first_k_dense_replace"], hf["num_hidden_layers"]),
        d_mlp_dense=hf["intermediate_size"],
        router=scores,
        router_renormalize=hf["norm_topk_prob"] if model_type == "deepseek_v3" else False,
        router_scale=float(hf["routed_scaling_factor"]),
        router_groups=hf["n_group"] if grouped else 1,
        router_topk_groups=hf["topk_group"] if grouped else 1,
        router_group_score="top2" if model_type == "deepseek_v3" else "max",
        router_bias=model_type == "deepseek_v3",
        kv_rank=hf["kv_lora_rank"],
        q_rank=hf.get("q_lora_rank") or 0,
        d_head_v=hf["v_head_dim"],
        # V2 always rotates DeepSeek's interleaved pairs; V3 when rope_interleave (its default)
        rotary_pairs="interleaved" if model_type == "deepseek_v2" or hf["rope_interleave"] else "halves",
    )


def _mscale(hf: dict, rotary: Rope) -> float:
    """yarn's mscale(factor, mscale_all_dim), which DeepSeek's softmax scale carries squared (transformers'
    yarn_apply_mscale: for any scaled rotary with a nonzero mscale_all_dim)."""
    params = {**(hf.get("rope_scaling") or {}), **(hf.get("rope_parameters") or {})}
    m = params.get("mscale_all_dim") or 0
    if rotary.scaling is None or not m or rotary.scaling.factor <= 1:
        return 1.0
    return 0.1 * m * math.log(rotary.scaling.factor) + 1.0


def _refuse_nulls(hf: dict, model_type: str, methods: tuple[str, ...]) -> None:
    """A null where resid needs a value: named, before anything is read or allocated."""
    grouped = hf.get("topk_method", methods[0]) != "greedy"
    nulls = [name for name in (*NOT_NULL, *(("n_group", "topk_group") if grouped else ())) if name in hf
             and hf[name] is None and (name != "rope_interleave" or model_type == "deepseek_v3")]
    if nulls:
        defaults = DEFAULTS[model_type]
        shown = "; ".join(f"{name}: null (a config.json without it reads transformers' default, {defaults[name]!r})"
                          if defaults.get(name) is not None else f"{name}: null or missing (transformers has no "
                          "default)" for name in nulls)
        raise ResidError(f"This {model_type} config.json has {shown}. resid needs a value to compute the model: write "
                         "the checkpoint's own value there.")


def _refuse(hf: dict, model_type: str, scores: str, methods: tuple[str, ...]) -> None:
    """Options transformers' DeepSeek does not compute, or computes differently from DeepSeek's own code."""
    problems = []
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        problems.append("attention_bias / mlp_bias true (no released DeepSeek has them; resid does not compute them)")
    if hf.get("num_key_value_heads") not in (None, hf["num_attention_heads"]):
        problems.append(f"num_key_value_heads={hf['num_key_value_heads']} differs from num_attention_heads="
                        f"{hf['num_attention_heads']} (latent attention gives every head its own keys and values)")
    if hf.get("head_dim") not in (None, hf["qk_rope_head_dim"]):
        problems.append(f"head_dim={hf['head_dim']} is not qk_rope_head_dim={hf['qk_rope_head_dim']} (transformers "
                        "rotates head_dim dims)")
    if hf.get("qk_head_dim") not in (None, hf["qk_nope_head_dim"] + hf["qk_rope_head_dim"]):
        problems.append(f"qk_head_dim={hf['qk_head_dim']} is not qk_nope_head_dim + qk_rope_head_dim")
    if hf.get("moe_layer_freq") not in (None, 1):
        problems.append(f"moe_layer_freq={hf['moe_layer_freq']} (transformers puts experts in every layer after the "
                        "dense ones)")
    if hf.get("scoring_func", scores) != scores:
        problems.append(f"scoring_func={hf['scoring_func']!r} (transformers' {model_type} scores with {scores!r})")
    if hf.get("topk_method", methods[0]) not in methods:
        problems.append(f"topk_method={hf['topk_method']!r} (transformers' {model_type} computes "
                        f"{' and '.join(map(repr, methods))})")
    if model_type == "deepseek_v2" and hf.get("norm_topk_prob"):
        problems.append("norm_topk_prob true (transformers' DeepSeek V2 never renormalizes, DeepSeek's own code "
                        "does)")
    if problems:
        raise ResidError(f"This {model_type} config.json asks for " + "; ".join(problems) + ". resid loads "
                         "DeepSeek V2/V3 as transformers computes them; use a checkpoint without these settings.")


def keys(config: ModelConfig) -> list[Key]:
    attn, mlp = "model.layers.{layer}.self_attn", "model.layers.{layer}.mlp"
    head = "(head d_head) d_model -> head d_model d_head"
    table = [
        Key("embed.W_E", "model.embed_tokens.weight"),
        Key("ln_final.w", "model.norm.weight"),
    ]
    if not config.tie_embeddings:
        table.append(Key("unembed.W_U", "lm_head.weight", "d_vocab d_model -> d_model d_vocab"))
    layer = [
        Key("blocks.{layer}.ln_attn.w", "model.layers.{layer}.input_layernorm.weight"),
        Key("blocks.{layer}.ln_mlp.w", "model.layers.{layer}.post_attention_layernorm.weight"),
        Key("blocks.{layer}.attn._w_dkv", f"{attn}.kv_a_proj_with_mqa.weight"),  # [W_DKV | W_KR], fused
        Key("blocks.{layer}.attn.kv_latent_norm.w", f"{attn}.kv_a_layernorm.weight"),
        Key("blocks.{layer}.attn._w_ukv", f"{attn}.kv_b_proj.weight"),  # per head [W_UK | W_UV], fused
        Key("blocks.{layer}.attn.W_O", f"{attn}.o_proj.weight", "d_model (head d_v) -> head d_v d_model"),
    ]
    if config.q_rank:
        layer += [
            Key("blocks.{layer}.attn.W_DQ", f"{attn}.q_a_proj.weight", "q_rank d_model -> d_model q_rank"),
            Key("blocks.{layer}.attn.q_latent_norm.w", f"{attn}.q_a_layernorm.weight"),
            Key("blocks.{layer}.attn.W_UQ", f"{attn}.q_b_proj.weight", "(head d_head) q_rank -> head q_rank d_head"),
        ]
    else:
        layer.append(Key("blocks.{layer}.attn.W_Q", f"{attn}.q_proj.weight", head))
    table += per_layer(layer, config.n_layers)
    for l in range(config.n_layers):
        table += mlp_keys(config, l, mlp.format(layer=l), f"blocks.{l}.mlp")
    return table


def mlp_keys(config: ModelConfig, layer: int, mlp: str, at: str, shared_name: str = "shared_experts") -> list[Key]:
    """Layer `layer`'s MLP keys: a dense SwiGLU, or the router, routed experts and fused shared experts under
    DeepSeek's names (Qwen3 MoE, OLMoE and GLM-4.5 share them; Qwen2 MoE calls its shared MLP shared_expert and
    gates it, shared_expert_gate)."""
    if not config.has_experts(layer):
        return [Key(f"{at}.W_in", f"{mlp}.up_proj.weight", "d_mlp d_model -> d_model d_mlp"),
                Key(f"{at}.W_gate", f"{mlp}.gate_proj.weight", "d_mlp d_model -> d_model d_mlp"),
                Key(f"{at}.W_out", f"{mlp}.down_proj.weight", "d_model d_mlp -> d_mlp d_model")]
    table = [Key(f"{at}.W_router", f"{mlp}.gate.weight", "routed d_model -> d_model routed")]
    if config.router_bias:
        table.append(Key(f"{at}.router_bias", f"{mlp}.gate.e_score_correction_bias"))
    routed = config.n_experts - config.n_shared_experts
    for e in range(routed):  # targets like blocks.3.mlp.W_in.5: expert 5's [d_model d_mlp] view
        table += [
            Key(f"{at}.W_gate.{e}", f"{mlp}.experts.{e}.gate_proj.weight", "d_mlp d_model -> d_model d_mlp"),
            Key(f"{at}.W_in.{e}", f"{mlp}.experts.{e}.up_proj.weight", "d_mlp d_model -> d_model d_mlp"),
            Key(f"{at}.W_out.{e}", f"{mlp}.experts.{e}.down_proj.weight", "d_model d_mlp -> d_mlp d_model"),
        ]
    for s in range(config.n_shared_experts):  # shared expert s: neurons s * d_mlp ... of the fused shared MLP
        e, shared = routed + s, f"{mlp}.{shared_name}"
        table += [
            Key(f"{at}.W_gate.{e}", f"{shared}.gate_proj.weight", "(shared d_mlp) d_model -> shared d_model d_mlp",
                pick=s),
            Key(f"{at}.W_in.{e}", f"{shared}.up_proj.weight", "(shared d_mlp) d_model -> shared d_model d_mlp", pick=s),
            Key(f"{at}.W_out.{e}", f"{shared}.down_proj.weight", "d_model (shared d_mlp) -> shared d_mlp d_model",
                pick=s),
        ]
    if config.shared_expert_gate:
        table.append(Key(f"{at}._w_shared_gate", f"{mlp}.shared_expert_gate.weight"))
    return table


FAMILY = Family(
    model_types=("deepseek_v2", "deepseek_v3"),
    config=config_from_hf,
    keys=keys,
    ignore=(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"model\.layers\.61\..*"),
    prepend_bos=True,
    fields=FIELDS,
)
