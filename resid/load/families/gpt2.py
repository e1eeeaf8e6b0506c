"""GPT-2 (Radford et al. 2019): learned positions, pre-norm LayerNorm, gelu_new MLP, biases everywhere,
tied embeddings.

Trap: GPT-2's linear layers are `Conv1D`, whose weight is stored [in out] (x @ W + b), the transpose of
nn.Linear's [out in]. So the MLP weights c_fc [d_model d_mlp] and c_proj [d_mlp d_model] are already in
resid's W_in / W_out layout (no transpose), and the attention weights need patterns whose *second* axis is
the fused output: c_attn [d_model (three head d_head)] holds Q, K and V side by side, split with `pick`.
Checkpoints also carry non-weight buffers (`h.N.attn.bias`, the causal mask, and `masked_bias`): ignored.
"""

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.load.families import Family, activation, hf_get
from resid.load.weights import Key, per_layer


def config_from_hf(hf: dict) -> ModelConfig:
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"):
        if hf.get(flag):
            raise ResidError(
                f"GPT-2 config.json sets {flag}=true, which resid does not support (it changes the attention "
                "per layer or adds cross-attention); only standard GPT-2 attention is supported."
            )
    d_model, n_heads = hf["n_embd"], hf["n_head"]
    d_head = d_model // n_heads
    return ModelConfig(
        architecture="gpt2",
        d_model=d_model,
        n_layers=hf["n_layer"],
        n_heads=n_heads,
        n_kv_heads=n_heads,
        d_head=d_head,
        d_mlp=hf_get(hf, "n_inner", default=4 * d_model),
        d_vocab=hf["vocab_size"],
        n_ctx=hf_get(hf, "n_positions", "n_ctx", default=1024),
        norm="layernorm",
        norm_eps=hf_get(hf, "layer_norm_epsilon", default=1e-5),
        block="sequential",
        positions="learned",
        attn_qkv_bias=True,
        attn_out_bias=True,
        # scale_attn_weights=false: raw q.k scores, as Hugging Face does.
        attn_scale=None if hf.get("scale_attn_weights", True) else 1.0,
        act=activation(hf_get(hf, "activation_function", default="gelu_new")),
        gated_mlp=False,
        mlp_bias=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
    )


def keys(config: ModelConfig) -> list[Key]:
    h = "transformer.h.{layer}"
    # Conv1D: [in out]; c_attn's out axis is (three head d_head): Q's columns, then K's, then V's.
    qkv = "d_model (three head d_head) -> three head d_model d_head"
    qkv_bias = "(three head d_head) -> three head d_head"
    table = [
        Key("embed.W_E", "transformer.wte.weight"),
        Key("pos_embed.W_pos", "transformer.wpe.weight"),
        Key("blocks.{layer}.ln_attn.w", f"{h}.ln_1.weight"),
        Key("blocks.{layer}.ln_attn.b", f"{h}.ln_1.bias"),
        Key("blocks.{layer}.attn.W_Q", f"{h}.attn.c_attn.weight", qkv, pick=0),
        Key("blocks.{layer}.attn.W_K", f"{h}.attn.c_attn.weight", qkv, pick=1),
        Key("blocks.{layer}.attn.W_V", f"{h}.attn.c_attn.weight", qkv, pick=2),
        Key("blocks.{layer}.attn.b_Q", f"{h}.attn.c_attn.bias", qkv_bias, pick=0),
        Key("blocks.{layer}.attn.b_K", f"{h}.attn.c_attn.bias", qkv_bias, pick=1),
        Key("blocks.{layer}.attn.b_V", f"{h}.attn.c_attn.bias", qkv_bias, pick=2),
        # Conv1D [in out]: rows are the concatenated heads' z.
        Key("blocks.{layer}.attn.W_O", f"{h}.attn.c_proj.weight", "(head d_head) d_model -> head d_head d_model"),
        Key("blocks.{layer}.attn.b_O", f"{h}.attn.c_proj.bias"),
        Key("blocks.{layer}.ln_mlp.w", f"{h}.ln_2.weight"),
        Key("blocks.{layer}.ln_mlp.b", f"{h}.ln_2.bias"),
        # Conv1D [in out] is already resid's [d_model d_mlp] / [d_mlp d_model]: no transpose here.
        Key("blocks.{layer}.mlp.W_in", f"{h}.mlp.c_fc.weight"),
        Key("blocks.{layer}.mlp.b_in", f"{h}.mlp.c_fc.bias"),
        Key("blocks.{layer}.mlp.W_out", f"{h}.mlp.c_proj.weight"),
        Key("blocks.{layer}.mlp.b_out", f"{h}.mlp.c_proj.bias"),
        Key("ln_final.w", "transformer.ln_f.weight"),
        Key("ln_final.b", "transformer.ln_f.bias"),
    ]
    if not config.tie_embeddings:
        # lm_head is an nn.Linear, not a Conv1D: [d_vocab d_model].
        table.append(Key("unembed.W_U", "lm_head.weight", "d_vocab d_model -> d_model d_vocab"))
    return per_layer(table, config.n_layers)


FAMILY = Family(
    model_types=("gpt2",),
    config=config_from_hf,
    keys=keys,
    prefix="transformer.",
    head_keys=("lm_head.weight",),
    ignore=(r"transformer\.h\.\d+\.attn\.(bias|masked_bias)",),
    prepend_bos=False,
    fields=frozenset({
        "n_embd", "n_head", "n_layer", "n_inner", "n_positions", "n_ctx", "vocab_size", "layer_norm_epsilon",
        "activation_function", "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn",
        "add_cross_attention", "tie_word_embeddings",
    }),
)
