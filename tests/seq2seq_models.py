"""Tiny random encoder-decoder models and their references. Not a test file.

`vanilla()` builds the original Transformer as torch.nn.Transformer (norm_first=False: post-LN, ReLU) wrapped
with the 2017 embedding scale (sqrt(d_model)), the interleaved sinusoidal encoding and shared embeddings, and
the same model as a resid.EncoderDecoder (weights copied by hand here, independently of resid's loaders).
`marian(folder)` saves a tiny random Hugging Face MarianMTModel (different encoder and decoder depths and head
counts, swish, scaled embeddings, a final_logits_bias) and returns it in eval mode, fp32, eager attention.
"""

import math
from pathlib import Path

import torch
import transformers
from torch import nn

import resid
from resid.components.embed import sinusoids
from resid.config import ModelConfig
from resid.seq2seq import EncoderDecoder

D, HEADS, LAYERS, VOCAB, FFN, N_CTX = 32, 4, 2, 50, 64, 64
PAD = 59  # Marian's pad = decoder start token


class Vanilla(nn.Module):
    """nn.Transformer with the embedding and positional encoding of Vaswani et al. 2017 and a tied output."""

    def __init__(self):
        super().__init__()
        self.core = nn.Transformer(D, HEADS, LAYERS, LAYERS, FFN, dropout=0.0, batch_first=True, norm_first=False)
        self.embed = nn.Embedding(VOCAB, D)
        self.register_buffer("pe", sinusoids(N_CTX, D))

    def forward(self, source, target, source_padding=None):
        def embed(ids):
            return self.embed(ids) * math.sqrt(D) + self.pe[: ids.shape[1]]

        causal = nn.Transformer.generate_square_subsequent_mask(target.shape[1])
        out = self.core(embed(source), embed(target), tgt_mask=causal, tgt_is_causal=True,
                        src_key_padding_mask=source_padding, memory_key_padding_mask=source_padding)
        return out @ self.embed.weight.T


def vanilla(seed: int = 0) -> tuple[Vanilla, EncoderDecoder]:
    torch.manual_seed(seed)
    reference = Vanilla().eval()
    with torch.no_grad():
        for name, param in reference.named_parameters():
            gain = name.endswith("weight") and "norm" in name
            param.copy_((1.0 if gain else 0.0) + 0.25 * torch.randn_like(param))
    common = dict(
        architecture="transformer", d_model=D, n_layers=LAYERS, n_heads=HEADS, n_kv_heads=HEADS, d_head=D // HEADS,
        d_mlp=FFN, d_vocab=VOCAB, n_ctx=N_CTX, norm="layernorm", norm_eps=1e-5, positions="sinusoidal",
        attn_qkv_bias=True, attn_out_bias=True, pre_norms=False, post_ln=True, act="relu", gated_mlp=False,
        mlp_bias=True, tie_embeddings=True, embed_scale=math.sqrt(D),
    )
    encoder = resid.Transformer(ModelConfig(**common, causal=False, head="none"))
    decoder = resid.Transformer(ModelConfig(**common, cross_attention=True))
    with torch.no_grad():
        for half in (encoder, decoder):
            half.embed.W_E.copy_(reference.embed.weight)
        for layer in range(LAYERS):
            ours, theirs = encoder.blocks[layer], reference.core.encoder.layers[layer]
            _attention(ours.attn, theirs.self_attn)
            _norm(ours.ln_attn_resid, theirs.norm1)
            _mlp(ours.mlp, theirs)
            _norm(ours.ln_mlp_resid, theirs.norm2)
            ours, theirs = decoder.blocks[layer], reference.core.decoder.layers[layer]
            _attention(ours.attn, theirs.self_attn)
            _norm(ours.ln_attn_resid, theirs.norm1)
            _attention(ours.cross, theirs.multihead_attn)
            _norm(ours.ln_cross_resid, theirs.norm2)
            _mlp(ours.mlp, theirs)
            _norm(ours.ln_mlp_resid, theirs.norm3)
        _norm(encoder.ln_final, reference.core.encoder.norm)  # nn.Transformer norms both stacks' outputs
        _norm(decoder.ln_final, reference.core.decoder.norm)
    return reference, EncoderDecoder(encoder.eval(), decoder.eval(), name="vanilla")


def _attention(ours, mha: nn.MultiheadAttention) -> None:
    weight, bias = mha.in_proj_weight, mha.in_proj_bias
    for i, x in enumerate("qkv"):
        getattr(ours, f"_w_{x}").copy_(weight[i * D : (i + 1) * D])
        getattr(ours, f"_b_{x}").copy_(bias[i * D : (i + 1) * D])
    ours._w_o.copy_(mha.out_proj.weight)
    ours.b_O.copy_(mha.out_proj.bias)


def _norm(ours, layer_norm: nn.LayerNorm) -> None:
    ours.w.copy_(layer_norm.weight)
    ours.b.copy_(layer_norm.bias)


def _mlp(ours, layer) -> None:
    ours._w_in.copy_(layer.linear1.weight)
    ours.b_in.copy_(layer.linear1.bias)
    ours._w_out.copy_(layer.linear2.weight)
    ours.b_out.copy_(layer.linear2.bias)


def marian_config() -> transformers.MarianConfig:
    return transformers.MarianConfig(
        vocab_size=60, d_model=D, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=48, max_position_embeddings=N_CTX,
        pad_token_id=PAD, eos_token_id=0, decoder_start_token_id=PAD, scale_embedding=True,
        activation_function="swish",
    )


def marian(folder: Path) -> transformers.MarianMTModel:
    torch.manual_seed(1)
    model = transformers.MarianMTModel(marian_config())
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "embed_positions" in name:  # the fixed sinusoids
                continue
            gain = "layer_norm.weight" in name
            param.copy_((1.0 if gain else 0.0) + 0.2 * torch.randn(param.shape, generator=generator))
        model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape, generator=generator))
    model.config._attn_implementation = "eager"
    transformers.utils.logging.disable_progress_bar()
    model.save_pretrained(folder, safe_serialization=True)
    return model.eval()
