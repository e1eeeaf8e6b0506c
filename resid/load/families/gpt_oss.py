"""gpt-oss (OpenAI 2025, model_type gpt_oss): Llama's pre-norm RMSNorm block with biases on every attention
projection, one learned sink logit per head in every softmax (attn_sinks, resid.components.sinks), sliding-window
attention on the layers layer_types names (every other one), yarn rotary, and each MLP a mixture of experts:

- the router has a bias (router_logit_bias); a token takes the top num_experts_per_tok experts by logit, weighted
  by the softmax of those logits (resid: the softmax over all, renormalized over the chosen: the same weights);
- each expert computes the clamped SwiGLU of a gate and a linear branch (resid.components.clamped_glu, swiglu_limit
  and swiglu_alpha), with biases on all three projections (expert_bias).

Trap: the experts are stored fused and transposed ([expert d_model 2 d_mlp], x @ W): gate_up_proj's columns alternate
gate, up, gate, up (the gate is ::2, the linear branch 1::2); down_proj is [expert d_mlp d_model].
The released checkpoints are MXFP4-quantized and refused (quantization_config); load a bf16 export.
"""

from resid.config import ModelConfig
from resid.load.families import Family, layer_types, llama
from resid.load.weights import Key, per_layer

DENSE_MLP = ("blocks.{layer}.mlp.W_in", "blocks.{layer}.mlp.W_gate", "blocks.{layer}.mlp.W_out")


def config_from_hf(hf: dict) -> ModelConfig:
    n_layers = hf["num_hidden_layers"]
    window = hf.get("sliding_window")
    types = layer_types(hf, n_layers) if window is not None else None
    if types is not None and "sliding" not in types:
        window = types = None
    plain = {k: v for k, v in hf.items() if k not in ("layer_types", "sliding_window")}
    bias = bool(hf.get("attention_bias", True))
    return llama.config_from_hf(
        plain, architecture="gpt_oss", sliding_window=window, layer_types=types, attn_qkv_bias=bias,
        attn_out_bias=bias, attn_sinks=True, n_experts=hf["num_local_experts"],
        experts_per_token=hf["num_experts_per_tok"], router_renormalize=True, router_logit_bias=True,
        expert_bias=True, act="clamped_swiglu", glu_limit=float(hf.get("swiglu_limit", 7.0)),
        glu_alpha=float(hf.get("swiglu_alpha", 1.702)),
    )


def keys(config: ModelConfig) -> list[Key]:
    attn, mlp = "model.layers.{layer}.self_attn", "model.layers.{layer}.mlp"
    experts = f"{mlp}.experts"
    table = [key for key in llama.table(config) if key.attribute not in DENSE_MLP]
    gate_up = "expert d_model (d_mlp two) -> two expert d_mlp d_model"
    gate_up_bias = "expert (d_mlp two) -> two expert d_mlp"
    table += [
        Key("blocks.{layer}.attn.sinks", f"{attn}.sinks"),
        Key("blocks.{layer}.mlp._w_router", f"{mlp}.router.weight"),
        Key("blocks.{layer}.mlp.b_router", f"{mlp}.router.bias"),
        Key("blocks.{layer}.mlp._w_gate", f"{experts}.gate_up_proj", gate_up, pick=0),
        Key("blocks.{layer}.mlp._w_in", f"{experts}.gate_up_proj", gate_up, pick=1),
        Key("blocks.{layer}.mlp.b_gate", f"{experts}.gate_up_proj_bias", gate_up_bias, pick=0),
        Key("blocks.{layer}.mlp.b_in", f"{experts}.gate_up_proj_bias", gate_up_bias, pick=1),
        Key("blocks.{layer}.mlp._w_out", f"{experts}.down_proj", "expert d_mlp d_model -> expert d_model d_mlp"),
        Key("blocks.{layer}.mlp.b_out", f"{experts}.down_proj_bias"),
    ]
    return per_layer(table, config.n_layers)


FAMILY = Family(
    model_types=("gpt_oss",),
    config=config_from_hf,
    keys=keys,
    prepend_bos=False,
    fields=llama.FIELDS | {"num_local_experts", "num_experts_per_tok", "swiglu_alpha", "swiglu_limit",
                           "initial_context_length"},
)
