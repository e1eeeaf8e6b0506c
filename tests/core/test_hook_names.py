"""resid.hook_names: TransformerLens names read the typed stream, with TransformerLens's conventions."""

import pytest
import torch
from random_models import make_random_model

import resid
from resid.hook_names import view

TEXTS = ["The quick brown fox jumps", "Hello"]


def _expected(model, stream) -> dict:
    """Every name this model should have, and the typed field (or TransformerLens-convention function of one)
    it must equal."""
    cfg = model.config
    expected = {"hook_embed": stream.embed}
    if cfg.positions == "learned":
        expected["hook_pos_embed"] = stream.pos_embed
    for l, record in enumerate(stream.layers):
        attn, mlp, at = record.attn, record.mlp, f"blocks.{l}."
        if cfg.positions == "rotary":
            expected |= {at + "attn.hook_rot_q": attn.q, at + "attn.hook_rot_k": attn.k}
        expected |= {
            at + "hook_resid_pre": stream.resid_pre(l),
            at + "attn.hook_q": attn.q_proj,  # before q/k norm and rotary: attn.q itself in models with neither
            at + "attn.hook_k": attn.k_proj,
            at + "attn.hook_v": attn.v,
            at + "attn.hook_attn_scores": attn.scores,
            at + "attn.hook_pattern": attn.pattern,
            at + "attn.hook_z": attn.z,
            at + "hook_attn_out": attn.out,
            at + "mlp.hook_pre": mlp.gate if cfg.gated_mlp else mlp.pre,
            at + "mlp.hook_post": mlp.post,
            at + "hook_mlp_out": mlp.out,
            at + "hook_resid_post": stream.resid_post(l),
        }
        if cfg.block != "parallel":
            expected[at + "hook_resid_mid"] = stream.resid_mid(l)
        if cfg.post_norms:
            expected[at + "ln1_post.hook_scale"] = 1 / attn.post_norm_scale
            expected[at + "ln2_post.hook_scale"] = 1 / mlp.post_norm_scale
        if cfg.pre_norms:  # OLMo 2's sublayers read the residual itself: no ln1 / ln2
            expected[at + "ln1.hook_scale"] = 1 / attn.norm_scale
            expected[at + "ln2.hook_scale"] = 1 / mlp.norm_scale
        if cfg.gated_mlp:
            expected[at + "mlp.hook_pre_linear"] = mlp.pre
    expected["ln_final.hook_scale"] = 1 / stream.final_norm_scale
    return expected


def test_every_name_equals_the_typed_field_it_maps_to(random_model):
    run = random_model.run(TEXTS, capture=resid.Capture.all())
    names, expected = view(run, random_model), _expected(random_model, run.stream)
    normalized = {n for n in names if n.endswith("hook_normalized")}
    assert set(names) - normalized == set(expected)
    assert len(normalized) == 2 * random_model.config.n_layers * random_model.config.pre_norms + 1
    for name, tensor in expected.items():
        torch.testing.assert_close(names[name], tensor, atol=0, rtol=0, msg=name)


def test_norm_hooks_follow_transformerlens(random_model):
    """hook_scale is sigma (sqrt(var + eps)) of the norm's input; hook_normalized is before gain and bias, so
    hook_normalized * gain + bias is resid's `normalized` (what the sublayer reads)."""
    run = random_model.run(TEXTS, capture=resid.Capture.all())
    names, stream = view(run, random_model), run.stream
    sequential = random_model.config.block != "parallel"
    reads = {
        "ln1": (stream.resid_pre, "attn", "ln_attn"),
        "ln2": (stream.resid_mid if sequential else stream.resid_pre, "mlp", "ln_mlp"),
    }
    for l, block in enumerate(random_model.blocks if random_model.config.pre_norms else []):
        for ln, (resid_in, part, norm_name) in reads.items():
            norm, record = getattr(block, norm_name), getattr(stream.layers[l], part)
            x = resid_in(l)
            centred = x - x.mean(-1, keepdim=True) if norm.centre else x
            sigma = (centred.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()
            torch.testing.assert_close(names[f"blocks.{l}.{ln}.hook_scale"], sigma, atol=1e-5, rtol=1e-5)
            unit = names[f"blocks.{l}.{ln}.hook_normalized"]
            torch.testing.assert_close(unit, centred / sigma, atol=1e-5, rtol=1e-5)
            bias = norm.b if norm.b is not None else 0
            torch.testing.assert_close(unit * norm.gain + bias, record.normalized, atol=1e-5, rtol=1e-5)
    final = stream.final()
    readout, _ = random_model.readout.normalize(final)
    gain, bias = random_model.ln_final.gain, random_model.ln_final.b
    expected = names["ln_final.hook_normalized"] * gain + (bias if bias is not None else 0)
    torch.testing.assert_close(expected, readout, atol=1e-5, rtol=1e-5)


def test_values_are_computed_when_read(random_model):
    run = random_model.run(TEXTS, capture=resid.Capture(attn={"out"}, mlp={"out"}))
    names = view(run, random_model)
    assert "blocks.0.attn.hook_z" in names and len(list(names.keys())) == len(names)  # listing reads nothing
    torch.testing.assert_close(names["blocks.2.hook_resid_pre"], run.stream.resid_pre(2), atol=0, rtol=0)
    # A field that was not captured raises the stream's own error, naming the Capture option.
    with pytest.raises(resid.ResidError, match=r"layers\[1\]\.attn\.z was not captured.*Capture\(attn=\{'z'"):
        names["blocks.1.attn.hook_z"]


def test_unknown_and_unrecorded_names_say_why(random_model):
    names = view(random_model.run(TEXTS, capture=resid.Capture.all()), random_model)
    with pytest.raises(resid.ResidError, match=r"Did you mean 'blocks\.1\.hook_resid_pre'"):
        names["blocks.1.hook_resid_pr"]
    with pytest.raises(resid.ResidError, match=r"layer 7 is out of range.*3 layers"):
        names["blocks.7.hook_mlp_out"]
    with pytest.raises(resid.ResidError, match=r"per-head writes are not stored.*resid\.heads\.head_results"):
        names["blocks.0.attn.hook_result"]
    assert names.get("blocks.0.attn.hook_result") is None and "hook_tokens" not in names  # dict-like
    if random_model.config.positions != "rotary":
        with pytest.raises(resid.ResidError, match="no rotary embedding: its queries are attn.hook_q"):
            names["blocks.0.attn.hook_rot_q"]
    if random_model.config.block == "parallel":
        with pytest.raises(resid.ResidError, match="parallel blocks have no resid_mid"):
            names["blocks.0.hook_resid_mid"]


def test_captured_positions_carry_through():
    model = make_random_model("gpt2_like")
    ids = torch.arange(8)[None]
    full = view(model.run(ids, capture=resid.Capture.all()), model)
    last = view(model.run(ids, capture=resid.Capture(positions=[-1], attn={"z", "out"})), model)
    torch.testing.assert_close(last["blocks.1.hook_resid_post"], full["blocks.1.hook_resid_post"][:, -1:])
    torch.testing.assert_close(last["blocks.2.attn.hook_z"], full["blocks.2.attn.hook_z"][:, -1:])
