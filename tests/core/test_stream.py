"""The ResidualStream records what Capture asks for, with consistent shapes and values."""

import pytest
import torch

import resid
from resid import Site
from resid.capture import ATTN_FIELDS, MLP_FIELDS

TEXTS = ["The quick brown fox jumps", "Hello"]


def test_capture_all_shapes_and_consistency(random_model):
    cfg = random_model.config
    run = random_model.run(TEXTS, capture=resid.Capture.all())
    batch, n_pos = run.tokens.ids.shape
    stream = run.stream
    assert stream.embed.shape == (batch, n_pos, cfg.d_model)
    assert (stream.pos_embed is None) == (cfg.positions == "rotary")
    assert stream.final_norm_scale.shape == (batch, n_pos, 1)
    for layer in range(cfg.n_layers):
        attn, mlp = stream.layers[layer].attn, stream.layers[layer].mlp
        assert attn.q.shape == attn.z.shape == (batch, n_pos, cfg.n_heads, cfg.d_head)
        assert attn.k.shape == attn.v.shape == (batch, n_pos, cfg.n_kv_heads, cfg.d_head)
        assert attn.pattern.shape == (batch, cfg.n_heads, n_pos, n_pos)
        assert mlp.pre.shape == mlp.post.shape == (batch, n_pos, cfg.d_mlp)
        # attention rows are distributions over earlier (real) keys only
        torch.testing.assert_close(attn.pattern.sum(-1), torch.ones(batch, cfg.n_heads, n_pos))
        assert torch.triu(attn.pattern, diagonal=1).abs().max() == 0
        # the write is the heads' z through W_O (and the post-norm, its scale as recorded)
        block = random_model.blocks[layer]
        recomputed = torch.einsum("b p h e, h e d -> b p d", attn.z, block.attn.W_O)
        if block.attn.b_O is not None:
            recomputed = recomputed + block.attn.b_O
        if block.ln_attn_post is not None:
            recomputed = block.ln_attn_post(recomputed, attn.post_norm_scale)[0]
        torch.testing.assert_close(recomputed, attn.out, atol=1e-5, rtol=1e-5)
        # each neuron writes post[i] * W_out[i] (through the post-norm)
        neuron_sum = torch.einsum("b p m, m d -> b p d", mlp.post, block.mlp.W_out)
        if block.mlp.b_out is not None:
            neuron_sum = neuron_sum + block.mlp.b_out
        if block.ln_mlp_post is not None:
            neuron_sum = block.ln_mlp_post(neuron_sum, mlp.post_norm_scale)[0]
        torch.testing.assert_close(neuron_sum, mlp.out, atol=1e-5, rtol=1e-5)
        assert (cfg.post_norms and attn.post_norm_scale.shape == (batch, n_pos, 1)) or not cfg.post_norms
        # the recorded norm scale and normalized input reproduce the norm
        ln = block.ln_attn
        if ln is None:  # no pre-norms (OLMo 2): attention reads the residual itself
            continue
        x = stream.resid_pre(layer)
        centred = x - x.mean(-1, keepdim=True) if ln.centre else x
        expected = centred * attn.norm_scale * ln.gain + (ln.b if ln.b is not None else 0)
        torch.testing.assert_close(attn.normalized, expected, atol=1e-5, rtol=1e-5)


def test_capturing_the_pattern_does_not_change_the_numbers(random_model):
    fast = random_model.run(TEXTS, capture=resid.Capture(attn={"z", "out"}))
    slow = random_model.run(TEXTS, capture=resid.Capture(attn={"z", "out", "pattern"}))
    assert torch.equal(fast.logits, slow.logits)  # bitwise: tests/core/test_capture.py checks every field
    for a, b in zip(fast.stream.layers, slow.stream.layers):
        assert torch.equal(a.attn.z, b.attn.z)


def test_pattern_times_values_is_z(random_model):
    """The pattern recorded beside SDPA is the one the heads used."""
    run = random_model.run(TEXTS, capture=resid.Capture.all())
    group = random_model.config.n_heads // random_model.config.n_kv_heads
    for record in run.stream.layers:
        v = record.attn.v.repeat_interleave(group, dim=2)
        z = torch.einsum("b h q k, b k h d -> b q h d", record.attn.pattern, v)
        torch.testing.assert_close(z, record.attn.z, atol=1e-5, rtol=1e-5)


def test_missing_field_names_the_capture_option(random_model):
    run = random_model.run(TEXTS)
    with pytest.raises(resid.ResidError, match=r"Capture\(attn=\{'pattern'"):
        run.stream.layers[0].attn.pattern
    with pytest.raises(resid.ResidError, match=r"Capture\(mlp=\{'post'"):
        run.stream.layers[1].mlp.post
    none = random_model.run(TEXTS, capture=resid.Capture.none()).stream
    with pytest.raises(resid.ResidError, match=r"Capture\(embed=True\)"):
        none.embed
    with pytest.raises(resid.ResidError, match=r"final_norm_scale was not captured\. Run with "
                                               r"resid\.Capture\(final_norm_scale=True\), or resid\.Capture\.all"):
        none.final_norm_scale
    with pytest.raises(resid.ResidError, match=r"was not captured\. Run with resid\.Capture\(embed=True\)"):
        none.resid_post(0)  # the residual is rebuilt from the embedding, which Capture.none() drops


def test_gate_only_for_gated_mlps(random_model):
    run = random_model.run(TEXTS, capture=resid.Capture.all())
    mlp = run.stream.layers[0].mlp
    if random_model.config.gated_mlp:
        torch.testing.assert_close(mlp.post, random_model.blocks[0].mlp.act(mlp.gate) * mlp.pre)
    else:
        with pytest.raises(resid.ResidError, match="not gated"):
            mlp.gate


def test_positions_and_layers_restrict_memory(random_model):
    full = random_model.run(TEXTS, capture=resid.Capture.all())
    last = random_model.run(TEXTS, capture=resid.Capture(
        positions=(-1,), attn=ATTN_FIELDS, mlp=MLP_FIELDS))
    n_pos = full.tokens.ids.shape[1]
    assert last.stream.final().shape[1] == 1
    torch.testing.assert_close(last.stream.final(), full.stream.final()[:, -1:])
    torch.testing.assert_close(last.stream.layers[1].attn.pattern, full.stream.layers[1].attn.pattern[:, :, -1:])
    assert last.stream.layers[1].attn.pattern.shape[-1] == n_pos
    torch.testing.assert_close(last.logits, full.logits)

    only = random_model.run(TEXTS, capture=resid.Capture(layers=(1,), mlp={"post", "out"}))
    assert only.stream.layers[1].mlp.post.shape[-1] == random_model.config.d_mlp
    with pytest.raises(resid.ResidError, match=r"Run with resid\.Capture\(mlp=\{'out', \.\.\.\}\) \(and layer 0 in "
                                               r"Capture\.layers\)"):
        only.stream.layers[0].mlp.out
    with pytest.raises(resid.ResidError, match=r"layers\[0\]\.attn\.out was not captured\. Run with "
                                               r"resid\.Capture\(attn=\{'out', \.\.\.\}\) \(and layer 0 in"):
        only.stream.resid_pre(2)  # the residual at layer 2 sums the writes of layers 0 and 1


def test_capture_validation(random_model):
    with pytest.raises(resid.ResidError, match=r"unknown field\(s\) \['patern'\]; choose from \[.*'pattern'"):
        resid.Capture(attn={"patern"})
    n = random_model.config.n_layers
    with pytest.raises(resid.ResidError, match=rf"Capture\(layers=\.\.\.\) has \[7\] out of range: the model has "
                                               rf"{n} layers \(0\.\.{n - 1}\)"):
        random_model.run(TEXTS, capture=resid.Capture(layers=(7,)))
    with pytest.raises(resid.ResidError, match=r"Position\(s\) \[40\] are out of range for prompt 0"):
        random_model.run(TEXTS, capture=resid.Capture(positions=(40,)))


def test_captured_positions_are_prompt_relative(random_model):
    """Capture(positions=[0, -1]) keeps each prompt's first and last token, whichever side is padded."""
    for side in ("left", "right"):
        tokens = random_model.to_tokens(TEXTS, padding_side=side)
        full = random_model.run(tokens)
        kept = random_model.run(tokens, capture=resid.Capture(positions=[0, -1]), logits_at=[0, -1])
        rows = torch.arange(len(TEXTS))
        first, last = tokens.first_positions(), tokens.last_positions()
        expected = torch.stack([full.stream.final()[rows, first], full.stream.final()[rows, last]], dim=1)
        torch.testing.assert_close(kept.stream.final(), expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(kept.logits[:, 1], full.logits[rows, last], atol=1e-5, rtol=1e-5)
        assert kept.stream.captured.tolist() == torch.stack([first, last], dim=1).tolist()


def test_resid_sums(random_model):
    stream = random_model.run(TEXTS).stream
    n = random_model.config.n_layers
    for layer in range(n - 1):
        torch.testing.assert_close(stream.resid_pre(layer + 1), stream.resid_post(layer))
    sites, writes = stream.components()
    assert sites[0] == Site(None, "embed") and sites[-1] == Site(n - 1, "mlp")
    assert writes.shape[0] == len(sites)
    torch.testing.assert_close(writes.sum(0), stream.final(), atol=1e-5, rtol=1e-5)
    # the running sums, computed once, agree with the per-site accessors
    sites, accumulated = stream.accumulated("sublayer")
    parallel = random_model.config.block == "parallel"
    assert len(sites) == 1 + n * (1 if parallel else 2) and sites[0] == Site(0, "resid_pre")
    torch.testing.assert_close(accumulated[-1], stream.final())
    if not parallel:
        torch.testing.assert_close(accumulated[1], stream.resid_mid(0))
    layer_sites, by_layer = stream.accumulated("layer")
    assert layer_sites == [Site(0, "resid_pre")] + [Site(l, "resid_post") for l in range(n)]
    for layer in range(n):
        torch.testing.assert_close(by_layer[layer], stream.resid_pre(layer))
    assert (stream.resid_mid(0) is None) == (random_model.config.block == "parallel")
    with pytest.raises(resid.ResidError,
                       match=rf"Layer {n} is out of range: the model has {n} layers \(0\.\.{n - 1}\)"):
        stream.resid_post(n)


def test_a_layer_out_of_range_says_the_range(random_model):
    # issue 27: run.stream.layers[999] was a bare "tuple index out of range"
    layers = random_model.run("a b c").stream.layers
    n = random_model.config.n_layers
    with pytest.raises(resid.ResidError, match=rf"stream.layers\[999\] is out of range: the model has {n} layers, "
                                         rf"0..{n - 1} \(or -{n}..-1 from the last\)"):
        layers[999]
    with pytest.raises(IndexError):  # still a sequence: code that catches IndexError keeps working
        layers[-n - 1]
    assert isinstance(layers, tuple) and len(layers) == n and layers[-1] is list(layers)[n - 1]
    assert len(layers[:2]) == min(2, n)
