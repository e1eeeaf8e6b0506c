"""GPT-J (Wang & Komatsuzaki 2021) and its descendants: a parallel block whose attention and gelu MLP (fc_in,
fc_out, biased) read one LayerNorm (ln_1, read into ln_attn and ln_mlp), no attention biases, rotary on the first
rotary_dim dims of each head with interleaved pairs (2i, 2i + 1), regathered into rotate_half's halves at load
(rotary_halves), and a biased LM head.
"""

from resid.config import ModelConfig
from resid.load.families import Family, activation, hf_get, interleaved_rotary
from resid.load.weights import Key, per_layer


def config_from_hf(hf: dict) -> ModelConfig:
    d_model, n_heads = hf["n_embd"], hf["n_head"]
    d_head = d_model // n_heads
    rotary_dim = hf.get("rotary_dim")
    return ModelConfig(
        architecture="gptj",
        d_model=d_model,
        n_layers=hf["n_layer"],
        n_heads=n_heads,
        n_kv_heads=n_heads,
        d_head=d_head,
        d_mlp=hf_get(hf, "n_inner", default=4 * d_model),
        d_vocab=hf["vocab_size"],
        n_ctx=hf["n_positions"],
        norm="layernorm",
        norm_eps=hf_get(hf, "layer_norm_epsilon", default=1e-5),
        block="parallel",
        positions="rotary",
        rotary_dim=None if rotary_dim is None or rotary_dim == d_head else rotary_dim,
        rotary_base=10000.0,
        act=activation(hf.get("activation_function", "gelu_new")),
        gated_mlp=False,
        mlp_bias=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        unembed_bias=True,
    )


def keys(config: ModelConfig) -> list[Key]:
    layer = "transformer.h.{layer}"
    attn, mlp = f"{layer}.attn", f"{layer}.mlp"
    table = [
        Key("embed.W_E", "transformer.wte.weight"),
        Key("blocks.{layer}.ln_attn.w", f"{layer}.ln_1.weight"),
        Key("blocks.{layer}.ln_attn.b", f"{layer}.ln_1.bias"),
        Key("blocks.{layer}.ln_mlp.w", f"{layer}.ln_1.weight"),
        Key("blocks.{layer}.ln_mlp.b", f"{layer}.ln_1.bias"),
        Key("blocks.{layer}.attn.W_Q", f"{attn}.q_proj.weight", "(head d_head) d_model -> head d_model d_head"),
        Key("blocks.{layer}.attn.W_K", f"{attn}.k_proj.weight", "(kv_head d_head) d_model -> kv_head d_model d_head"),
        Key("blocks.{layer}.attn.W_V", f"{attn}.v_proj.weight", "(kv_head d_head) d_model -> kv_head d_model d_head"),
        Key("blocks.{layer}.attn.W_O", f"{attn}.out_proj.weight", "d_model (head d_head) -> head d_head d_model"),
        Key("blocks.{layer}.mlp.W_in", f"{mlp}.fc_in.weight", "d_mlp d_model -> d_model d_mlp"),
        Key("blocks.{layer}.mlp.b_in", f"{mlp}.fc_in.bias"),
        Key("blocks.{layer}.mlp.W_out", f"{mlp}.fc_out.weight", "d_model d_mlp -> d_mlp d_model"),
        Key("blocks.{layer}.mlp.b_out", f"{mlp}.fc_out.bias"),
        Key("ln_final.w", "transformer.ln_f.weight"),
        Key("ln_final.b", "transformer.ln_f.bias"),
        Key("unembed.b_U", "lm_head.bias"),
    ]
    if not config.tie_embeddings:
        table.append(Key("unembed.W_U", "lm_head.weight", "d_vocab d_model -> d_model d_vocab"))
    return per_layer(interleaved_rotary(table, config), config.n_layers)


FAMILY = Family(
    model_types=("gptj",),
    config=config_from_hf,
    keys=keys,
    prefix="transformer.",
    head_keys=("lm_head.weight", "lm_head.bias"),
    # the causal mask and the rotary table some checkpoints saved as buffers
    ignore=(r"transformer\.h\.\d+\.attn\.(bias|masked_bias|embed_positions)",),
    prepend_bos=False,
    fields=frozenset({
        "n_embd", "n_layer", "n_head", "n_inner", "n_positions", "vocab_size", "rotary_dim", "layer_norm_epsilon",
        "activation_function", "tie_word_embeddings",
    }),
)
