"""OPT (Zhang et al. 2022): GPT-2's block under other names: pre-norm LayerNorm, learned positions, biases on
every projection, a relu MLP (fc1, fc2), a final LayerNorm and tied embeddings.

Trap: the position table has two rows more than max_position_embeddings (fairseq's padding offset): position p is
row p + 2, so resid reads rows 2 on into W_pos.
The 350M model (post-LN, do_layer_norm_before false, and an embedding projected from word_embed_proj_dim) is
refused, as are norms without gains (layer_norm_elementwise_affine false).
"""

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.load.families import Family, activation, hf_get
from resid.load.weights import Key, per_layer

OFFSET = 2  # OPTLearnedPositionalEmbedding.offset


def config_from_hf(hf: dict) -> ModelConfig:
    d_model, n_heads = hf["hidden_size"], hf["num_attention_heads"]
    unsupported = {name: hf[name] for name, ok in (("do_layer_norm_before", True), ("_remove_final_layer_norm", False),
                                                   ("layer_norm_elementwise_affine", True))
                   if name in hf and hf[name] != ok}
    if hf_get(hf, "word_embed_proj_dim", default=d_model) != d_model:
        unsupported["word_embed_proj_dim"] = hf["word_embed_proj_dim"]
    if unsupported:
        raise ResidError(f"config.json has {unsupported}: an OPT variant (post-LN, projected embeddings or norms "
                         "without gains: OPT-350M) that resid does not support. The other OPT sizes load.")
    bias = bool(hf.get("enable_bias", True))
    return ModelConfig(
        architecture="opt",
        d_model=d_model,
        n_layers=hf["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=n_heads,
        d_head=d_model // n_heads,
        d_mlp=hf["ffn_dim"],
        d_vocab=hf["vocab_size"],
        n_ctx=hf["max_position_embeddings"],
        norm="layernorm",
        norm_eps=1e-5,  # nn.LayerNorm's default: OPT's config has no epsilon
        positions="learned",
        attn_qkv_bias=bias,
        attn_out_bias=bias,
        act=activation(hf.get("activation_function", "relu")),
        gated_mlp=False,
        mlp_bias=bias,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
    )


def keys(config: ModelConfig) -> list[Key]:
    layer = "model.decoder.layers.{layer}"
    attn = f"{layer}.self_attn"
    n_pos = config.n_ctx + OFFSET
    table = [
        Key("embed.W_E", "model.decoder.embed_tokens.weight"),
        Key("pos_embed.W_pos", "model.decoder.embed_positions.weight", rows=(OFFSET, n_pos, n_pos)),
        Key("blocks.{layer}.ln_attn.w", f"{layer}.self_attn_layer_norm.weight"),
        Key("blocks.{layer}.ln_attn.b", f"{layer}.self_attn_layer_norm.bias"),
        Key("blocks.{layer}.attn.W_Q", f"{attn}.q_proj.weight", "(head d_head) d_model -> head d_model d_head"),
        Key("blocks.{layer}.attn.W_K", f"{attn}.k_proj.weight", "(kv_head d_head) d_model -> kv_head d_model d_head"),
        Key("blocks.{layer}.attn.W_V", f"{attn}.v_proj.weight", "(kv_head d_head) d_model -> kv_head d_model d_head"),
        Key("blocks.{layer}.attn.W_O", f"{attn}.out_proj.weight", "d_model (head d_head) -> head d_head d_model"),
        Key("blocks.{layer}.ln_mlp.w", f"{layer}.final_layer_norm.weight"),
        Key("blocks.{layer}.ln_mlp.b", f"{layer}.final_layer_norm.bias"),
        Key("blocks.{layer}.mlp.W_in", f"{layer}.fc1.weight", "d_mlp d_model -> d_model d_mlp"),
        Key("blocks.{layer}.mlp.W_out", f"{layer}.fc2.weight", "d_model d_mlp -> d_mlp d_model"),
        Key("ln_final.w", "model.decoder.final_layer_norm.weight"),
        Key("ln_final.b", "model.decoder.final_layer_norm.bias"),
    ]
    if config.attn_qkv_bias:
        table += [
            Key("blocks.{layer}.attn.b_Q", f"{attn}.q_proj.bias", "(head d_head) -> head d_head"),
            Key("blocks.{layer}.attn.b_K", f"{attn}.k_proj.bias", "(kv_head d_head) -> kv_head d_head"),
            Key("blocks.{layer}.attn.b_V", f"{attn}.v_proj.bias", "(kv_head d_head) -> kv_head d_head"),
            Key("blocks.{layer}.attn.b_O", f"{attn}.out_proj.bias"),
            Key("blocks.{layer}.mlp.b_in", f"{layer}.fc1.bias"),
            Key("blocks.{layer}.mlp.b_out", f"{layer}.fc2.bias"),
        ]
    if not config.tie_embeddings:
        table.append(Key("unembed.W_U", "lm_head.weight", "d_vocab d_model -> d_model d_vocab"))
    return per_layer(table, config.n_layers)


FAMILY = Family(
    model_types=("opt",),
    config=config_from_hf,
    keys=keys,
    prepend_bos=True,
    fields=frozenset({
        "hidden_size", "num_hidden_layers", "num_attention_heads", "ffn_dim", "max_position_embeddings", "vocab_size",
        "do_layer_norm_before", "_remove_final_layer_norm", "word_embed_proj_dim", "dropout", "layerdrop",
        "activation_function", "enable_bias", "layer_norm_elementwise_affine", "tie_word_embeddings", "init_std",
        "activation_dropout",
    }),
)
