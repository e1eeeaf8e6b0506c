"""GPT-BigCode (SantaCoder, StarCoder 1; Allal et al. 2023): GPT-2's block (learned positions, LayerNorm, biases
everywhere, a gelu MLP) with multi-query attention: one key/value head shared by every query head.

Trap: unlike GPT-2 its layers are nn.Linear ([out in]), and the fused c_attn stacks the rows of every query head,
then the key head's, then the value head's under multi_query; without it each head's q, k and v rows are together,
(head three d_head).
"""

from resid.config import ModelConfig
from resid.load.families import Family, activation, hf_get
from resid.load.weights import Key, per_layer


def config_from_hf(hf: dict) -> ModelConfig:
    d_model, n_heads = hf["n_embd"], hf["n_head"]
    return ModelConfig(
        architecture="gpt_bigcode",
        d_model=d_model,
        n_layers=hf["n_layer"],
        n_heads=n_heads,
        n_kv_heads=1 if hf.get("multi_query", True) else n_heads,
        d_head=d_model // n_heads,
        d_mlp=hf_get(hf, "n_inner", default=4 * d_model),
        d_vocab=hf["vocab_size"],
        n_ctx=hf["n_positions"],
        norm="layernorm",
        norm_eps=hf_get(hf, "layer_norm_epsilon", default=1e-5),
        positions="learned",
        attn_qkv_bias=True,
        attn_out_bias=True,
        attn_scale=None if hf.get("scale_attn_weights", True) else 1.0,
        act=activation(hf.get("activation_function", "gelu_pytorch_tanh")),
        gated_mlp=False,
        mlp_bias=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
    )


def keys(config: ModelConfig) -> list[Key]:
    h = "transformer.h.{layer}"
    c_attn = f"{h}.attn.c_attn"
    if config.n_kv_heads == 1:  # q rows, then the one key head's, then the value head's
        d_q, d_kv = config.n_heads * config.d_head, config.d_head
        total = d_q + 2 * d_kv
        parts = {"Q": (0, d_q), "K": (d_q, d_q + d_kv), "V": (d_q + d_kv, total)}
        qkv = [Key(f"blocks.{{layer}}.attn.W_{n}", f"{c_attn}.weight",
                   f"({'head' if n == 'Q' else 'kv_head'} d_head) d_model -> "
                   f"{'head' if n == 'Q' else 'kv_head'} d_model d_head", rows=(*span, total))
               for n, span in parts.items()]
        qkv += [Key(f"blocks.{{layer}}.attn.b_{n}", f"{c_attn}.bias",
                    f"({'head' if n == 'Q' else 'kv_head'} d_head) -> {'head' if n == 'Q' else 'kv_head'} d_head",
                    rows=(*span, total)) for n, span in parts.items()]
    else:
        qkv = [Key(f"blocks.{{layer}}.attn.W_{n}", f"{c_attn}.weight",
                   "(head three d_head) d_model -> three head d_model d_head", pick=i) for i, n in enumerate("QKV")]
        qkv += [Key(f"blocks.{{layer}}.attn.b_{n}", f"{c_attn}.bias", "(head three d_head) -> three head d_head",
                    pick=i) for i, n in enumerate("QKV")]
    table = [
        Key("embed.W_E", "transformer.wte.weight"),
        Key("pos_embed.W_pos", "transformer.wpe.weight"),
        Key("blocks.{layer}.ln_attn.w", f"{h}.ln_1.weight"),
        Key("blocks.{layer}.ln_attn.b", f"{h}.ln_1.bias"),
        *qkv,
        Key("blocks.{layer}.attn.W_O", f"{h}.attn.c_proj.weight", "d_model (head d_head) -> head d_head d_model"),
        Key("blocks.{layer}.attn.b_O", f"{h}.attn.c_proj.bias"),
        Key("blocks.{layer}.ln_mlp.w", f"{h}.ln_2.weight"),
        Key("blocks.{layer}.ln_mlp.b", f"{h}.ln_2.bias"),
        Key("blocks.{layer}.mlp.W_in", f"{h}.mlp.c_fc.weight", "d_mlp d_model -> d_model d_mlp"),
        Key("blocks.{layer}.mlp.b_in", f"{h}.mlp.c_fc.bias"),
        Key("blocks.{layer}.mlp.W_out", f"{h}.mlp.c_proj.weight", "d_model d_mlp -> d_mlp d_model"),
        Key("blocks.{layer}.mlp.b_out", f"{h}.mlp.c_proj.bias"),
        Key("ln_final.w", "transformer.ln_f.weight"),
        Key("ln_final.b", "transformer.ln_f.bias"),
    ]
    if not config.tie_embeddings:
        table.append(Key("unembed.W_U", "lm_head.weight", "d_vocab d_model -> d_model d_vocab"))
    return per_layer(table, config.n_layers)


FAMILY = Family(
    model_types=("gpt_bigcode",),
    config=config_from_hf,
    keys=keys,
    prefix="transformer.",
    ignore=(r"transformer\.h\.\d+\.attn\.(bias|masked_bias)",),
    prepend_bos=False,
    fields=frozenset({
        "n_embd", "n_head", "n_layer", "n_inner", "n_positions", "vocab_size", "layer_norm_epsilon",
        "activation_function", "scale_attn_weights", "attention_softmax_in_fp32", "scale_attention_softmax_in_fp32",
        "multi_query", "num_key_value_heads", "tie_word_embeddings", "n_ctx",
    }),
)
