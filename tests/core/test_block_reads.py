"""Block.reads names the residual each sublayer reads: run on the stream's own value at that Site, the sublayer
reproduces its recorded write, in every block topology (pre-norm, GPT-2 biases, parallel, sandwich norms with
soft caps, post-norms only, post-LN, and a decoder with cross-attention, whose MLP reads resid_cross)."""

import pytest
import torch
from random_models import make_random_model
from seq2seq_models import vanilla

from resid.capture import Capture
from resid.errors import ResidError
from resid.sites import Site

IDS = [11, 5, 7, 2, 9, 31, 3]
FAMILIES = ["llama_gqa", "gpt2_like", "neox_parallel", "gemma3_like", "olmo2_like", "post_ln"]


def _model(kind: str):
    if kind == "post_ln":
        return make_random_model("gpt2_like", pre_norms=False, post_ln=True, causal=False, final_norm=False,
                                 embed_norm=True)
    return make_random_model(kind)


def _sublayer(norm, resid, sublayer, post):
    """A sublayer's write from the residual it reads: pre-norm (if any), the sublayer, post-norm (if any)."""
    raw = sublayer(resid if norm is None else norm.normalize(resid))
    return raw if post is None else post.normalize(raw)


def _check_mlp(block, run) -> None:
    resid = run.stream.read(block.reads("mlp"))
    write = _sublayer(block.ln_mlp, resid, lambda x: block.mlp(x, frozenset(), ())[0], block.ln_mlp_post)
    torch.testing.assert_close(write, run.stream.layers[block.layer].mlp.out, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", FAMILIES)
@torch.no_grad()
def test_each_sublayer_reads_the_residual_block_reads_names(kind):
    model = _model(kind)
    ids = torch.tensor([IDS]) % model.config.d_vocab
    run = model.run(ids, capture=Capture(attn={"out"}, mlp={"out"}))
    ctx = model.attention_context(ids)
    for block in model.blocks:
        assert block.reads("attn") == Site(block.layer, "resid_pre")
        resid = run.stream.read(block.reads("attn"))
        write = _sublayer(block.ln_attn, resid, lambda x: block.attn(x, ctx, frozenset(), ())[0], block.ln_attn_post)
        torch.testing.assert_close(write, run.stream.layers[block.layer].attn.out, atol=1e-5, rtol=1e-5)
        _check_mlp(block, run)
    parallel = model.config.block == "parallel"
    assert model.blocks[0].reads("mlp") == Site(0, "resid_pre" if parallel else "resid_mid")


@torch.no_grad()
def test_a_decoders_mlp_reads_the_residual_after_cross_attention():
    model = vanilla()[1]
    source, target = torch.tensor([[3, 8, 1, 4]]), torch.tensor([[5, 2, 9]])
    run = model.run(source, target, capture=Capture(attn={"out"}, mlp={"out"}))
    for block in model.decoder.blocks:
        assert block.reads("cross") == Site(block.layer, "resid_mid")
        assert block.reads("mlp") == Site(block.layer, "resid_cross")
        _check_mlp(block, run)


def test_a_part_the_block_lacks_is_refused():
    block = make_random_model("llama_gqa").blocks[1]
    with pytest.raises(ResidError, match=r"Layer 1's sublayers are 'attn', 'mlp', got 'cross'"):
        block.reads("cross")
    with pytest.raises(ResidError, match="got 'resid_pre'"):
        block.reads("resid_pre")
