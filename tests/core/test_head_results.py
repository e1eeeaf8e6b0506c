"""resid.heads.head_results: every head's write, stacked with its Site, sums with b_O to the attention write on every
architecture (post-norms through their frozen scale), at the positions and layers asked for, with TransformerLens's
apply_ln; what it cannot compute is one clear error."""

import pytest
import torch
from random_models import make_random_model, randomize

import resid
from resid import Capture, Site
from resid.errors import ResidError
from resid.heads import head_results

TEXTS = ["The quick brown fox jumps over", "Hello there"]  # left-padded
CAPTURE = Capture(attn={"z", "post_norm_scale", "out"})  # the scale is kept only in models with post-norms
SUM_TOL = dict(atol=1e-5, rtol=1e-5)  # float32 sums over heads in another order


def _bias_write(model: resid.Transformer, layer: int, run: resid.Run) -> torch.Tensor:
    """What the layer writes beside its heads: b_O, through the frozen post-norm (its bias too) where there is one."""
    block, attn = model.blocks[layer], run.stream.layers[layer].attn
    b_O = torch.zeros(model.config.d_model) if block.attn.b_O is None else block.attn.b_O
    if block.ln_attn_post is None:
        return b_O
    return block.ln_attn_post.frozen(b_O.expand_as(attn.out), attn.post_norm_scale)


def _sites(layer: int, n_heads: int) -> list[Site]:
    return [Site(layer, "attn", head=h) for h in range(n_heads)]


def test_heads_sum_to_the_attention_write(random_model):
    cfg = random_model.config
    run = random_model.run(TEXTS, capture=CAPTURE)
    sites, writes = head_results(run, random_model)
    batch, n_pos = run.tokens.ids.shape
    assert writes.shape == (cfg.n_layers * cfg.n_heads, batch, n_pos, cfg.d_model)
    assert [site.label for site in sites[:cfg.n_heads + 1]] == [
        *(f"layers[0].attn.head[{h}]" for h in range(cfg.n_heads)), "layers[1].attn.head[0]"]
    for layer in range(cfg.n_layers):
        heads = writes[layer * cfg.n_heads:(layer + 1) * cfg.n_heads]
        total = heads.sum(0) + _bias_write(random_model, layer, run)
        torch.testing.assert_close(total, run.stream.layers[layer].attn.out, **SUM_TOL, msg=f"layer {layer}")
    # head h's row is its own z through its own W_O (the first head of layer 1, pre-norm models)
    if not cfg.post_norms:
        z = run.stream.layers[1].attn.z[:, :, 0]
        torch.testing.assert_close(writes[cfg.n_heads], z @ random_model.blocks[1].attn.W_O[0], **SUM_TOL)


def test_positions_and_layers_select_rows(random_model):
    run = random_model.run(TEXTS, capture=CAPTURE)
    _, every = head_results(run, random_model)
    sites, last = head_results(run, random_model, layers=[-1], positions=[-1, 0])
    n_heads = random_model.config.n_heads
    assert sites == _sites(2, n_heads)
    index = run.tokens.padded_index([-1, 0])  # [batch 2]
    expected = every[-n_heads:].gather(2, index[None, :, :, None].expand(n_heads, -1, -1, every.shape[-1]))
    torch.testing.assert_close(last, expected, atol=1e-6, rtol=1e-6)
    one_sites, one = head_results(run, random_model, layers=1)
    assert one_sites == _sites(1, n_heads) and torch.equal(one, every[n_heads:2 * n_heads])


def test_captured_positions_are_the_positions():
    model = make_random_model("llama_gqa")
    ids = torch.arange(3, 10)[None]
    _, every = head_results(model.run(ids, capture=Capture(attn={"z"})), model)
    _, last = head_results(model.run(ids, capture=Capture(attn={"z"}, positions=[-1])), model)
    torch.testing.assert_close(last, every[:, :, -1:], atol=1e-6, rtol=1e-6)


def test_apply_ln_is_the_standardized_final_norm():
    """apply_ln: centre(write) * final_norm_scale (TransformerLens's apply_ln_to_stack, before the gain), so the
    heads' rows plus b_O standardized sum to the attention write standardized by the same frozen scale."""
    for kind in ("gpt2_like", "llama_gqa"):  # LayerNorm (centred) and RMSNorm
        model = make_random_model(kind)
        run = model.run(torch.arange(3, 10)[None], capture=Capture(attn={"z", "out"}))
        _, plain = head_results(run, model, layers=[0])
        _, normed = head_results(run, model, layers=[0], apply_ln=True)
        centred = plain - plain.mean(-1, keepdim=True) if model.config.norm == "layernorm" else plain
        torch.testing.assert_close(normed, centred * run.stream.final_norm_scale, **SUM_TOL)


def test_what_cannot_be_computed_says_why():
    model = make_random_model("llama_gqa")
    run = model.run(torch.arange(3, 10)[None], capture=Capture(attn={"z"}))
    with pytest.raises(ResidError, match=r"layers\[1\]\.attn\.z was not captured.*Capture\(attn=\{'z'"):
        head_results(model.run(torch.arange(3, 10)[None]), model, layers=[1])
    with pytest.raises(ResidError, match=r"layers\[5\]\.attn: layer 5 is out of range; the model has 3 layers"):
        head_results(run, model, layers=[5])
    kept = model.run(torch.arange(3, 10)[None], capture=Capture(attn={"z"}, positions=[-1]))
    with pytest.raises(ResidError, match=r"kept only some positions.*leave positions=None"):
        head_results(kept, model, positions=[-1])
    stopped = model.run(torch.arange(3, 10)[None], capture=Capture(attn={"z"}), stop_at_layer=2)
    assert head_results(stopped, model)[1].shape[0] == 2 * model.config.n_heads
    with pytest.raises(ResidError, match=r"stopped before the final norm"):
        head_results(stopped, model, apply_ln=True)
    post_ln = randomize(resid.Transformer(resid.ModelConfig(
        architecture="post_ln", d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, d_head=8, d_mlp=64, d_vocab=97,
        n_ctx=64, norm="layernorm", norm_eps=1e-5, positions="learned", pre_norms=False, post_ln=True, gated_mlp=False,
        act="gelu"), name="random-post-ln"), 0)
    run = post_ln.run(torch.arange(3, 10)[None], capture=Capture(attn={"z", "out"}))
    _, writes = head_results(run, post_ln)  # the writes themselves are defined: they sum to `out`
    torch.testing.assert_close(writes[:4].sum(0), run.stream.layers[0].attn.out, **SUM_TOL)
    with pytest.raises(ResidError, match=r"is post-LN.*use apply_ln=False"):
        head_results(run, post_ln, apply_ln=True)
