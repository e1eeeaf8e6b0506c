"""BERT (Devlin et al. 2019): a post-LN encoder. Learned positions and token-type embeddings summed and normed,
bidirectional attention over the real tokens, x = LN(x + sublayer(x)) after each sublayer, a GELU MLP, biases
everywhere, no final norm.

The head comes from config.json's `architectures`: BertForMaskedLM / BertForPreTraining have the masked-LM
head (cls.predictions: transform dense + act + LayerNorm, a decoder tied to the word embeddings, its bias);
anything else (BertModel, sentence-transformers checkpoints such as all-MiniLM-L6-v2) is an embedding model
whose output is the last hidden state. The pooler (used only for next-sentence prediction and classification)
and NSP head are not read. Texts are wrapped by the tokenizer's own template, [CLS] text [SEP].
"""

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.load.families import Family, activation
from resid.load.weights import Key, per_layer

MLM_ARCHITECTURES = ("BertForMaskedLM", "BertForPreTraining")
TRAINING_ONLY = frozenset({"hidden_dropout_prob", "attention_probs_dropout_prob", "gradient_checkpointing",
                           "classifier_dropout"})


def config_from_hf(hf: dict) -> ModelConfig:
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise ResidError("This BERT config.json sets is_decoder / add_cross_attention: resid reads BERT as an encoder.")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ResidError(
            f"BERT position_embedding_type {hf['position_embedding_type']!r} is not supported; resid reads 'absolute'."
        )
    d_model, n_heads = hf["hidden_size"], hf["num_attention_heads"]
    mlm = any(name in MLM_ARCHITECTURES for name in hf.get("architectures") or ())
    return ModelConfig(
        architecture="bert",
        d_model=d_model,
        n_layers=hf["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=n_heads,
        d_head=d_model // n_heads,
        d_mlp=hf["intermediate_size"],
        d_vocab=hf["vocab_size"],
        n_ctx=hf.get("max_position_embeddings", 512),
        norm="layernorm",
        norm_eps=hf.get("layer_norm_eps", 1e-12),
        positions="learned",
        attn_qkv_bias=True,
        attn_out_bias=True,
        pre_norms=False,
        post_ln=True,
        embed_norm=True,
        final_norm=False,
        causal=False,
        n_token_types=hf.get("type_vocab_size", 2),
        head="mlm" if mlm else "none",
        act=activation(hf.get("hidden_act", "gelu")),
        gated_mlp=False,
        mlp_bias=True,
        tie_embeddings=not mlm or bool(hf.get("tie_word_embeddings", True)),
        unembed_bias=mlm,
    )


HEAD = "cls.predictions"


def keys(config: ModelConfig) -> list[Key]:
    layer = "bert.encoder.layer.{layer}"
    attn = f"{layer}.attention"
    table = [
        Key("embed.W_E", "bert.embeddings.word_embeddings.weight"),
        Key("pos_embed.W_pos", "bert.embeddings.position_embeddings.weight"),
        Key("type_embed.W_type", "bert.embeddings.token_type_embeddings.weight"),
        Key("ln_embed.w", "bert.embeddings.LayerNorm.weight"),
        Key("ln_embed.b", "bert.embeddings.LayerNorm.bias"),
        Key("blocks.{layer}.attn.W_Q", f"{attn}.self.query.weight", "(head d_head) d_model -> head d_model d_head"),
        Key("blocks.{layer}.attn.W_K", f"{attn}.self.key.weight", "(head d_head) d_model -> head d_model d_head"),
        Key("blocks.{layer}.attn.W_V", f"{attn}.self.value.weight", "(head d_head) d_model -> head d_model d_head"),
        Key("blocks.{layer}.attn.b_Q", f"{attn}.self.query.bias", "(head d_head) -> head d_head"),
        Key("blocks.{layer}.attn.b_K", f"{attn}.self.key.bias", "(head d_head) -> head d_head"),
        Key("blocks.{layer}.attn.b_V", f"{attn}.self.value.bias", "(head d_head) -> head d_head"),
        Key("blocks.{layer}.attn.W_O", f"{attn}.output.dense.weight", "d_model (head d_head) -> head d_head d_model"),
        Key("blocks.{layer}.attn.b_O", f"{attn}.output.dense.bias"),
        Key("blocks.{layer}.ln_attn_resid.w", f"{attn}.output.LayerNorm.weight"),
        Key("blocks.{layer}.ln_attn_resid.b", f"{attn}.output.LayerNorm.bias"),
        Key("blocks.{layer}.mlp.W_in", f"{layer}.intermediate.dense.weight", "d_mlp d_model -> d_model d_mlp"),
        Key("blocks.{layer}.mlp.b_in", f"{layer}.intermediate.dense.bias"),
        Key("blocks.{layer}.mlp.W_out", f"{layer}.output.dense.weight", "d_model d_mlp -> d_mlp d_model"),
        Key("blocks.{layer}.mlp.b_out", f"{layer}.output.dense.bias"),
        Key("blocks.{layer}.ln_mlp_resid.w", f"{layer}.output.LayerNorm.weight"),
        Key("blocks.{layer}.ln_mlp_resid.b", f"{layer}.output.LayerNorm.bias"),
    ]
    if config.head == "mlm":
        table += [
            Key("mlm_head.W_dense", f"{HEAD}.transform.dense.weight", "d_out d_in -> d_in d_out"),
            Key("mlm_head.b_dense", f"{HEAD}.transform.dense.bias"),
            Key("mlm_head.ln.w", f"{HEAD}.transform.LayerNorm.weight"),
            Key("mlm_head.ln.b", f"{HEAD}.transform.LayerNorm.bias"),
            Key("unembed.b_U", f"{HEAD}.bias"),
        ]
        if not config.tie_embeddings:
            table.append(Key("unembed.W_U", f"{HEAD}.decoder.weight", "d_vocab d_model -> d_model d_vocab"))
    return per_layer(table, config.n_layers)


FAMILY = Family(
    model_types=("bert",),
    config=config_from_hf,
    keys=keys,
    prefix="bert.",
    head_keys=tuple(f"{HEAD}.{name}" for name in (
        "bias", "transform.dense.weight", "transform.dense.bias", "transform.LayerNorm.weight",
        "transform.LayerNorm.bias", "decoder.weight", "decoder.bias",
    )) + ("cls.seq_relationship.weight", "cls.seq_relationship.bias"),
    # not weights of what resid computes: the position-id buffer, the pooler and next-sentence head (not part of
    # the masked-LM or hidden-state outputs), the tied decoder (the word embeddings) and its copy of the bias
    ignore=(r"bert\.embeddings\.position_ids", r"bert\.pooler\.dense\.(weight|bias)", r"cls\.seq_relationship\..*",
            rf"{HEAD}\.decoder\.(weight|bias)"),
    prepend_bos=True,
    template=True,
    fields=frozenset({
        "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
        "max_position_embeddings", "layer_norm_eps", "hidden_act", "type_vocab_size", "position_embedding_type",
        "is_decoder", "add_cross_attention", "tie_word_embeddings",
    }) | TRAINING_ONLY,
)
