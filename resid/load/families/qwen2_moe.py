"""Qwen1.5-MoE and Qwen2-MoE (model_type qwen2_moe): Qwen2's attention (q/k/v biases, qkv_bias) with each MLP a
softmax-routed mixture of SwiGLU experts plus one shared expert MLP that every token reads, weighted by its own
sigmoid gate, sigmoid(x W_shared_gate) (shared_expert_gate).

resid splits the shared MLP (shared_expert_intermediate_size neurons) into shared experts of the routed experts'
width (moe_intermediate_size), every one weighted by the same gate: their sum is the shared MLP's write. A shared
width that is not a multiple of the routed one is refused, as are dense layers that do not lead (mlp_only_layers,
decoder_sparse_step).
"""

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.load.families import Family, deepseek, llama, qwen3_moe
from resid.load.weights import Key, per_layer


def config_from_hf(hf: dict) -> ModelConfig:
    d_mlp, shared = hf["moe_intermediate_size"], hf.get("shared_expert_intermediate_size") or 0
    if shared % d_mlp:
        raise ResidError(f"config.json's shared_expert_intermediate_size={shared} is not a multiple of "
                         f"moe_intermediate_size={d_mlp}: resid splits the shared MLP into experts of the routed "
                         "width. Use a model whose shared width is such a multiple.")
    dense = qwen3_moe.dense_layers(hf, hf["num_hidden_layers"])
    n_shared = shared // d_mlp
    bias = bool(hf.get("qkv_bias", True))
    return llama.config_from_hf(
        {**hf, "model_type": "qwen2"}, architecture="qwen2_moe", attn_qkv_bias=bias, attn_out_bias=False, d_mlp=d_mlp,
        n_experts=hf["num_experts"] + n_shared, n_shared_experts=n_shared, shared_expert_gate=n_shared > 0,
        experts_per_token=hf["num_experts_per_tok"], router_renormalize=bool(hf.get("norm_topk_prob", False)),
        n_dense_layers=dense, d_mlp_dense=hf["intermediate_size"] if dense else None,
    )


def keys(config: ModelConfig) -> list[Key]:
    table = per_layer([key for key in llama.table(config) if key.attribute not in qwen3_moe.DENSE_MLP],
                      config.n_layers)
    for layer in range(config.n_layers):
        table += deepseek.mlp_keys(config, layer, f"model.layers.{layer}.mlp", f"blocks.{layer}.mlp",
                                   shared_name="shared_expert")
    return table


FAMILY = Family(
    model_types=("qwen2_moe",),
    config=config_from_hf,
    keys=keys,
    prepend_bos=False,
    fields=llama.FIELDS | {"num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                           "decoder_sparse_step", "mlp_only_layers", "shared_expert_intermediate_size", "qkv_bias"},
)
