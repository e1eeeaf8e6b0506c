"""GPT-Neo (Black et al. 2021): GPT-2's block with separate q/k/v projections (no biases; the output projection has
one), unscaled attention scores (q . k, no 1/sqrt(d_head)), and layers alternating global attention with local
attention over the last window_size keys (attention_layers: "global" / "local").
"""

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.load.families import Family, activation, hf_get
from resid.load.weights import Key, per_layer


def config_from_hf(hf: dict) -> ModelConfig:
    d_model, n_heads, n_layers = hf["hidden_size"], hf["num_heads"], hf["num_layers"]
    kinds = hf.get("attention_layers")
    if kinds is None:
        kinds = [kind for group, repeat in hf["attention_types"] for _ in range(repeat) for kind in group]
    if len(kinds) != n_layers or not set(kinds) <= {"global", "local"}:
        raise ResidError(f"config.json's attention_layers must give 'global' or 'local' for each of its {n_layers} "
                         f"layers, but it is {kinds!r}. Fix that field of config.json.")
    types = tuple("sliding" if kind == "local" else "full" for kind in kinds)
    local = "sliding" in types
    return ModelConfig(
        architecture="gpt_neo",
        d_model=d_model,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_heads,
        d_head=d_model // n_heads,
        d_mlp=hf_get(hf, "intermediate_size", default=4 * d_model),
        d_vocab=hf["vocab_size"],
        n_ctx=hf["max_position_embeddings"],
        norm="layernorm",
        norm_eps=hf_get(hf, "layer_norm_epsilon", default=1e-5),
        positions="learned",
        attn_out_bias=True,
        attn_scale=1.0,
        sliding_window=hf["window_size"] if local else None,
        layer_types=types if local else None,
        act=activation(hf.get("activation_function", "gelu_new")),
        gated_mlp=False,
        mlp_bias=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
    )


def keys(config: ModelConfig) -> list[Key]:
    h = "transformer.h.{layer}"
    attn = f"{h}.attn.attention"
    table = [
        Key("embed.W_E", "transformer.wte.weight"),
        Key("pos_embed.W_pos", "transformer.wpe.weight"),
        Key("blocks.{layer}.ln_attn.w", f"{h}.ln_1.weight"),
        Key("blocks.{layer}.ln_attn.b", f"{h}.ln_1.bias"),
        Key("blocks.{layer}.attn.W_Q", f"{attn}.q_proj.weight", "(head d_head) d_model -> head d_model d_head"),
        Key("blocks.{layer}.attn.W_K", f"{attn}.k_proj.weight", "(kv_head d_head) d_model -> kv_head d_model d_head"),
        Key("blocks.{layer}.attn.W_V", f"{attn}.v_proj.weight", "(kv_head d_head) d_model -> kv_head d_model d_head"),
        Key("blocks.{layer}.attn.W_O", f"{attn}.out_proj.weight", "d_model (head d_head) -> head d_head d_model"),
        Key("blocks.{layer}.attn.b_O", f"{attn}.out_proj.bias"),
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
    model_types=("gpt_neo",),
    config=config_from_hf,
    keys=keys,
    prefix="transformer.",
    ignore=(r"transformer\.h\.\d+\.attn\.attention\.(bias|masked_bias)",),
    prepend_bos=False,
    fields=frozenset({
        "hidden_size", "num_heads", "num_layers", "intermediate_size", "max_position_embeddings", "vocab_size",
        "layer_norm_epsilon", "activation_function", "attention_types", "attention_layers", "window_size",
        "resid_dropout", "embed_dropout", "tie_word_embeddings",
    }),
)
