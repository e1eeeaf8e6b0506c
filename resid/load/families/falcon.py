"""Falcon (Almazrouei et al. 2023): LayerNorm (with biases), rotary, a plain gelu MLP (dense_h_to_4h,
dense_4h_to_h), biases on every projection or none (bias), tied embeddings, in three layouts:

- new_decoder_architecture (Falcon-40B, -180B, Falcon 2/3): parallel blocks with their own norms (ln_attn,
  ln_mlp; one shared input_layernorm when num_ln_in_parallel_attn is 1) and grouped-query attention whose fused
  query_key_value stacks, per key/value group, its query heads' rows, then the key's, then the value's:
  (kv_head (q_per_kv + 2) d_head);
- multi_query (Falcon-7B): a parallel block reading one norm, every query head's rows, then one key head's and one
  value head's;
- neither: (head three d_head), each head's q, k and v rows together; parallel_attn false: sequential blocks.

alibi (the RW models' ALiBi instead of rotary) is refused.
"""

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.load.families import ROPE_CONFIG_FIELDS, Family, activation, context, hf_get, rope
from resid.load.weights import Key, per_layer


def config_from_hf(hf: dict) -> ModelConfig:
    if hf.get("alibi"):
        raise ResidError("config.json has alibi: true (ALiBi position biases instead of rotary), which resid does "
                         "not compute. Use a Falcon with rotary positions (alibi false).")
    d_model, n_heads = hf["hidden_size"], hf["num_attention_heads"]
    new = bool(hf.get("new_decoder_architecture"))
    n_kv = hf_get(hf, "num_kv_heads", default=n_heads) if new else (1 if hf.get("multi_query", True) else n_heads)
    rotary = rope(hf)
    bias = bool(hf.get("bias", False))
    return ModelConfig(
        architecture="falcon",
        d_model=d_model,
        n_layers=hf["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=n_kv,
        d_head=d_model // n_heads,
        d_mlp=hf_get(hf, "ffn_hidden_size", default=4 * d_model),
        d_vocab=hf["vocab_size"],
        n_ctx=context(hf, rotary),
        norm="layernorm",
        norm_eps=hf_get(hf, "layer_norm_epsilon", default=1e-5),
        block="parallel" if new or hf.get("parallel_attn", True) else "sequential",
        positions="rotary",
        rotary_base=rotary.base,
        rope_scaling=rotary.scaling,
        attn_qkv_bias=bias,
        attn_out_bias=bias,
        act=activation(hf.get("activation", "gelu")),
        gated_mlp=False,
        mlp_bias=bias,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
    )


def _qkv(config: ModelConfig, new: bool) -> list[Key]:
    """The q, k and v keys (weights, and biases when there are) of the fused query_key_value."""
    fused = "transformer.h.{layer}.self_attention.query_key_value"
    d, heads, kv = config.d_head, config.n_heads, config.n_kv_heads
    total = (heads + 2 * kv) * d
    if new or kv == 1:  # per group: q_per_kv query heads' rows, a key head's, a value head's (multi-query: 1 group)
        per = heads // kv + 2
        rows = {"Q": [g * per + i for g in range(kv) for i in range(per - 2)],
                "K": [g * per + per - 2 for g in range(kv)], "V": [g * per + per - 1 for g in range(kv)]}
        if not new:  # Falcon-7B: every query head, then the key head, then the value head
            rows = {"Q": list(range(heads)), "K": [heads], "V": [heads + 1]}
        out = []
        for name, slots in rows.items():
            order = tuple(slot * d + i for slot in slots for i in range(d))
            axis = "head" if name == "Q" else "kv_head"
            out.append(Key(f"blocks.{{layer}}.attn.W_{name}", f"{fused}.weight",
                           f"({axis} d_head) d_model -> {axis} d_model d_head", rows=(0, total, total), order=order))
            if config.attn_qkv_bias:
                out.append(Key(f"blocks.{{layer}}.attn.b_{name}", f"{fused}.bias", f"({axis} d_head) -> {axis} d_head",
                               rows=(0, total, total), order=order))
        return out
    out = [Key(f"blocks.{{layer}}.attn.W_{n}", f"{fused}.weight", "(head three d_head) d_model -> three head d_model "
               "d_head", pick=i) for i, n in enumerate("QKV")]
    if config.attn_qkv_bias:
        out += [Key(f"blocks.{{layer}}.attn.b_{n}", f"{fused}.bias", "(head three d_head) -> three head d_head", pick=i)
                for i, n in enumerate("QKV")]
    return out


def keys_for(config: ModelConfig, hf: dict) -> list[Key]:
    h = "transformer.h.{layer}"
    new = bool(hf.get("new_decoder_architecture"))
    if config.block == "sequential":
        norms = ("input_layernorm", "post_attention_layernorm")
    elif new and (hf.get("num_ln_in_parallel_attn") or 2) == 2:
        norms = ("ln_attn", "ln_mlp")
    else:
        norms = ("input_layernorm", "input_layernorm")
    table = [
        Key("embed.W_E", "transformer.word_embeddings.weight"),
        *[Key(f"blocks.{{layer}}.{mine}.{p}", f"{h}.{theirs}.{q}") for mine, theirs in zip(("ln_attn", "ln_mlp"), norms)
          for p, q in (("w", "weight"), ("b", "bias"))],
        *_qkv(config, new),
        Key("blocks.{layer}.attn.W_O", f"{h}.self_attention.dense.weight",
            "d_model (head d_head) -> head d_head d_model"),
        Key("blocks.{layer}.mlp.W_in", f"{h}.mlp.dense_h_to_4h.weight", "d_mlp d_model -> d_model d_mlp"),
        Key("blocks.{layer}.mlp.W_out", f"{h}.mlp.dense_4h_to_h.weight", "d_model d_mlp -> d_mlp d_model"),
        Key("ln_final.w", "transformer.ln_f.weight"),
        Key("ln_final.b", "transformer.ln_f.bias"),
    ]
    if config.attn_out_bias:
        table += [Key("blocks.{layer}.attn.b_O", f"{h}.self_attention.dense.bias"),
                  Key("blocks.{layer}.mlp.b_in", f"{h}.mlp.dense_h_to_4h.bias"),
                  Key("blocks.{layer}.mlp.b_out", f"{h}.mlp.dense_4h_to_h.bias")]
    if not config.tie_embeddings:
        table.append(Key("unembed.W_U", "lm_head.weight", "d_vocab d_model -> d_model d_vocab"))
    return per_layer(table, config.n_layers)


def keys(config: ModelConfig) -> list[Key]:
    raise ResidError("Falcon's key table depends on its config.json (new_decoder_architecture, "
                     "num_ln_in_parallel_attn); load the model from its Hugging Face folder.")


FAMILY = Family(
    model_types=("falcon",),
    config=config_from_hf,
    keys=keys,
    hf_keys=keys_for,
    prefix="transformer.",
    ignore=(),
    prepend_bos=False,
    fields=ROPE_CONFIG_FIELDS | {
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_kv_heads", "num_ln_in_parallel_attn",
        "layer_norm_epsilon", "alibi", "new_decoder_architecture", "multi_query", "parallel_attn", "bias",
        "ffn_hidden_size", "activation", "vocab_size", "tie_word_embeddings",
    },
)
