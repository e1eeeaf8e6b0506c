"""GLM-4.5 / 4.6 (Zhipu 2025, model_type glm4_moe): grouped-query attention with q/k/v biases, partial rotary
(rotate_half) and optional per-head q/k RMSNorm (use_qk_norm), and DeepSeek V3's mixture: a sigmoid router with the
selection bias (e_score_correction_bias), group-limited choice (groups scored by their two best experts),
renormalized (norm_topk_prob) and scaled (routed_scaling_factor) weights, shared experts read by every token, and
dense first layers (first_k_dense_replace, of width intermediate_size).

The multi-token-prediction layers the released checkpoints append (num_nextn_predict_layers, at index
num_hidden_layers: 46 in GLM-4.5-Air, 92 in GLM-4.5) are not part of the forward pass and are ignored.
"""

from resid.config import ModelConfig
from resid.load.families import Family, deepseek, llama
from resid.load.weights import Key, per_layer

DENSE_MLP = ("blocks.{layer}.mlp.W_in", "blocks.{layer}.mlp.W_gate", "blocks.{layer}.mlp.W_out")


def config_from_hf(hf: dict) -> ModelConfig:
    shared = hf.get("n_shared_experts") or 0
    groups = hf.get("n_group") or 1
    return llama.config_from_hf(
        hf, architecture="glm4_moe", qk_norm="head" if hf.get("use_qk_norm") else "none",
        attn_qkv_bias=bool(hf.get("attention_bias", False)), attn_out_bias=False,
        d_mlp=hf["moe_intermediate_size"], n_experts=hf["n_routed_experts"] + shared, n_shared_experts=shared,
        experts_per_token=hf["num_experts_per_tok"],
        n_dense_layers=min(hf.get("first_k_dense_replace") or 0, hf["num_hidden_layers"]),
        d_mlp_dense=hf["intermediate_size"], router="sigmoid", router_bias=True,
        router_renormalize=bool(hf.get("norm_topk_prob", True)),
        router_scale=float(hf.get("routed_scaling_factor", 1.0)), router_groups=groups,
        router_topk_groups=hf.get("topk_group") or 1, router_group_score="top2",
    )


def keys(config: ModelConfig) -> list[Key]:
    table = [key for key in llama.table(config) if key.attribute not in DENSE_MLP]
    if config.qk_norm != "none":
        table += llama.QK_NORMS
    table = per_layer(table, config.n_layers)
    for layer in range(config.n_layers):
        table += deepseek.mlp_keys(config, layer, f"model.layers.{layer}.mlp", f"blocks.{layer}.mlp")
    return table


FAMILY = Family(
    model_types=("glm4_moe",),
    config=config_from_hf,
    keys=keys,
    ignore=(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"model\.layers\.(46|92)\..*"),
    prepend_bos=False,
    fields=llama.FIELDS | {"moe_intermediate_size", "n_routed_experts", "n_shared_experts", "num_experts_per_tok",
                           "first_k_dense_replace", "norm_topk_prob", "routed_scaling_factor", "n_group",
                           "topk_group", "use_qk_norm", "num_nextn_predict_layers"},
)
