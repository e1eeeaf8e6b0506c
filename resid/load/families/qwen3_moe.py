"""Qwen3 MoE (Qwen3-30B-A3B, -235B-A22B) and OLMoE (Muennighoff et al. 2024, model_type olmoe): their attention's
q/k RMSNorm (per head in Qwen3, over the whole projection in OLMoE) with each MLP a sparse mixture of SwiGLU
experts (resid.components.moe): a softmax router ("gate"), the top num_experts_per_tok experts per token, their
weights renormalized to sum to 1 with norm_topk_prob (Qwen3: true in the released models; OLMoE: false).

Qwen3 MoE's dense layers (mlp_only_layers, decoder_sparse_step) must be the first ones (resid's n_dense_layers,
of width intermediate_size); any other placement is refused. Expert width: moe_intermediate_size (Qwen3),
intermediate_size (OLMoE).
"""

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.load.families import Family, deepseek, llama
from resid.load.weights import Key, per_layer

DENSE_MLP = ("blocks.{layer}.mlp.W_in", "blocks.{layer}.mlp.W_gate", "blocks.{layer}.mlp.W_out")


def dense_layers(hf: dict, n_layers: int) -> int:
    """How many leading layers are dense (transformers: a layer is sparse unless listed in mlp_only_layers or off
    the decoder_sparse_step grid); refused unless they are exactly the first ones."""
    only, step = set(hf.get("mlp_only_layers") or ()), hf.get("decoder_sparse_step") or 1
    dense = [layer for layer in range(n_layers) if layer in only or (layer + 1) % step != 0]
    if dense != list(range(len(dense))):
        raise ResidError(f"config.json places dense MLP layers at {dense} (mlp_only_layers, decoder_sparse_step); "
                         "resid's mixtures have their dense layers first only. Use a model whose dense layers lead.")
    return len(dense)


def config_from_hf(hf: dict) -> ModelConfig:
    model_type = hf["model_type"]
    n_layers = hf["num_hidden_layers"]
    if hf.get("clip_qkv") is not None:
        raise ResidError(f"config.json has clip_qkv={hf['clip_qkv']!r} (q, k and v clamped), which resid does not "
                         "compute. Use a model without it.")
    qwen = model_type == "qwen3_moe"
    dense = dense_layers(hf, n_layers) if qwen else 0
    return llama.config_from_hf(
        hf, architecture=model_type, qk_norm="head" if qwen else "all",
        d_mlp=hf["moe_intermediate_size"] if qwen else hf["intermediate_size"],
        n_experts=hf_experts(hf), experts_per_token=hf["num_experts_per_tok"],
        router_renormalize=bool(hf.get("norm_topk_prob", False)),
        n_dense_layers=dense, d_mlp_dense=hf["intermediate_size"] if dense else None,
    )


def hf_experts(hf: dict) -> int:
    return hf.get("num_experts") or hf["num_local_experts"]


def keys(config: ModelConfig) -> list[Key]:
    table = per_layer([key for key in llama.table(config) if key.attribute not in DENSE_MLP] + llama.QK_NORMS,
                      config.n_layers)
    for layer in range(config.n_layers):
        table += deepseek.mlp_keys(config, layer, f"model.layers.{layer}.mlp", f"blocks.{layer}.mlp")
    return table


FAMILY = Family(
    model_types=("qwen3_moe", "olmoe"),
    config=config_from_hf,
    keys=keys,
    prepend_bos=False,
    fields=llama.FIELDS | {"num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
                           "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "clip_qkv"},
)
