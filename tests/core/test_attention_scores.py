"""The attention scores (the softmax's input, TransformerLens's attn.hook_attn_scores) and the queries and keys
before q/k norm and rotary (attn.hook_q / hook_k): capturable, named by Sites and hook names, equal to an
independent computation of TransformerLens's definition, free when not captured, and the scores editable."""

import pytest
import torch
from random_models import make_random_model
from t5_models import t5

import resid
import resid.hook_names as hook_names
from resid import Add, Capture, Hook, Replace, Site
from resid.components.attention import ScoreInputs
from resid.components.rotary import Rotary
from resid.errors import ResidError

TEXTS = ["The quick brown fox jumps over", "Hello there"]  # left-padded: the second prompt has padding
NEW = frozenset({"scores", "q_proj", "k_proj"})
SCORE_TOL = dict(atol=1e-4, rtol=1e-4)  # float32 matmuls in another order


def _reference_scores(model: resid.Transformer, layer: int, q, k, tokens: resid.Tokens):
    """TransformerLens's definition, from the captured q and k: q k^T * scale, soft-capped, -inf at every key a
    query may not read (later, padding, outside the window), except that a padding query reads itself (resid's
    padding rule, which keeps its row finite)."""
    cfg, attn = model.config, model.blocks[layer].attn
    k = k.repeat_interleave(cfg.n_heads // cfg.n_kv_heads, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) * attn.scale
    if attn.softcap is not None:
        scores = attn.softcap * torch.tanh(scores / attn.softcap)
    n = q.shape[1]
    query, key = torch.arange(n)[:, None], torch.arange(n)[None, :]
    allowed = (key <= query) & tokens.attention_mask.bool().cpu()[:, None, :]
    window = cfg.window(cfg.layer_type(layer))
    if window is not None:
        allowed = allowed & (query - key < window)
    allowed = allowed | (key == query)
    return scores.masked_fill(~allowed[:, None], float("-inf"))


def test_scores_follow_transformerlens(random_model):
    run = random_model.run(TEXTS, capture=Capture.all())
    for layer, record in enumerate(run.stream.layers):
        attn = record.attn
        expected = _reference_scores(random_model, layer, attn.q, attn.k, run.tokens)
        masked = torch.isinf(expected)
        assert torch.equal(torch.isneginf(attn.scores), masked), f"layer {layer}: -inf exactly where masked"
        torch.testing.assert_close(attn.scores[~masked].double(), expected[~masked], **SCORE_TOL)
        # the pattern is the softmax of the scores, computed once: bitwise
        assert torch.equal(torch.softmax(attn.scores, -1, dtype=torch.float32), attn.pattern)
    assert bool(torch.isneginf(run.stream.layers[0].attn.scores[1, :, -1, 0]).all())  # a padding key, masked


def test_capturing_the_new_fields_changes_no_number(random_model):
    """Every number a run computes is bitwise the same whether scores, q_proj and k_proj are captured or not."""
    before = random_model.run(TEXTS, capture=Capture(attn=Capture.all().attn - NEW))
    after = random_model.run(TEXTS, capture=Capture.all())
    assert torch.equal(before.logits, after.logits)
    for old, new in zip(before.stream.layers, after.stream.layers, strict=True):
        for name in ("q", "k", "v", "pattern", "z", "out"):
            assert torch.equal(getattr(old.attn, name), getattr(new.attn, name)), name


def test_nothing_captured_computes_no_scores(monkeypatch):
    """Without scores or pattern captured, the fused attention runs alone: the scores are never formed. Captured,
    they are formed on their first read, not by the run."""
    model, ids = make_random_model("llama_gqa"), torch.tensor([[5, 6, 7, 8], [1, 2, 3, 4]])
    expected = model.run(ids).logits

    def refuse(*args, **kwargs):
        raise AssertionError("scores computed though nothing asked for them")

    monkeypatch.setattr(ScoreInputs, "scores", refuse)
    assert torch.equal(model.run(ids, capture=Capture(attn={"z", "q", "k"})).logits, expected)
    run = model.run(ids, capture=Capture(attn={"scores"}))
    with pytest.raises(AssertionError, match="scores computed"):
        run.stream.layers[0].attn.scores  # noqa: B018


def test_projections_come_before_norm_and_rotary(random_model):
    """q_proj / k_proj are the sublayer input times W_Q / W_K plus the biases; q and k are them q/k-normed and
    rotated by the model's own components. Where neither applies they are q and k themselves, kept once."""
    cfg = random_model.config
    run = random_model.run(TEXTS, capture=Capture(attn={"q_proj", "k_proj", "q", "k", "normalized", "out"}))
    layer = 1
    attn, block = run.stream.layers[layer].attn, random_model.blocks[layer]
    x = attn.normalized if cfg.pre_norms else run.stream.resid_pre(layer)
    for proj, weight, bias in ((attn.q_proj, block.attn.W_Q, block.attn.b_Q),
                               (attn.k_proj, block.attn.W_K, block.attn.b_K)):
        expected = torch.einsum("bpm,hmd->bphd", x, weight) + (0 if bias is None else bias)
        torch.testing.assert_close(proj, expected, atol=1e-5, rtol=1e-5)
    q, k = attn.q_proj, attn.k_proj
    if cfg.qk_norm == "head":
        q, k = block.attn.q_norm(q)[0], block.attn.k_norm(k)[0]
    if cfg.qk_norm == "all":
        q, k = block.attn.q_norm(q.flatten(-2))[0].view(q.shape), block.attn.k_norm(k.flatten(-2))[0].view(k.shape)
    if cfg.positions == "rotary":
        rotary = random_model.rotary_local if cfg.layer_type(layer) == "sliding" else random_model.rotary
        cos, sin = rotary.cos_sin(run.tokens.position_ids, random_model.dtype)
        q, k = Rotary.apply(q, cos, sin), Rotary.apply(k, cos, sin)
    assert torch.equal(q, attn.q) and torch.equal(k, attn.k)
    plain = cfg.positions != "rotary" and cfg.qk_norm == "none"
    assert (attn.q_proj is attn.q and attn.k_proj is attn.k) == plain


def test_sites_and_hook_names(random_model):
    run = random_model.run(TEXTS, capture=Capture.of([Site(2, "attn", head=1, field="scores"),
                                                      Site(2, "attn", head=3, field="q_proj"),
                                                      Site(2, "attn", kv_head=0, field="k_proj")]))
    attn = run.stream.layers[2].attn
    scores = Site.parse("layers[2].attn.head[1].scores")
    assert scores == Site(2, "attn", head=1, field="scores") and scores.hook_name == "blocks.2.attn.hook_attn_scores"
    assert torch.equal(run.read(scores), attn.scores[:, 1])
    assert torch.equal(run.read(Site(2, "attn", head=3, field="q_proj")), attn.q_proj[:, :, 3])
    assert torch.equal(run.read(Site(2, "attn", kv_head=0, field="k_proj")), attn.k_proj[:, :, 0])
    assert Site.from_hook_name("blocks.2.attn.hook_q", 3) == Site(2, "attn", head=3, field="q_proj")
    assert Site.from_hook_name("blocks.2.attn.hook_k", 0) == Site(2, "attn", kv_head=0, field="k_proj")
    assert Site.from_hook_name("blocks.2.attn.hook_attn_scores", 1) == scores
    names = hook_names.view(run, random_model)
    assert torch.equal(names["blocks.2.attn.hook_attn_scores"], attn.scores)
    assert torch.equal(names["blocks.2.attn.hook_q"], attn.q_proj)
    last = random_model.run(TEXTS, capture=Capture(positions=[-1], attn={"scores"}))
    # the kept rows are formed alone (q at the kept positions, every key): a matmul of other sizes, so to rounding
    torch.testing.assert_close(last.stream.layers[2].attn.scores, attn.scores[:, :, -1:], **SCORE_TOL)
    with pytest.raises(ResidError, match=r"attn\.scores was not captured.*Capture\(attn=\{'scores'"):
        random_model.run(TEXTS).stream.layers[0].attn.scores  # noqa: B018
    with pytest.raises(ResidError, match=r"kv_head=0 needs field='k', 'v' or 'k_proj'"):
        Site(2, "attn", kv_head=0, field="scores")


def test_edited_scores_change_the_pattern_that_follows(random_model):
    """An edit of a head's scores is what its softmax reads: shifting a row changes nothing (softmax is
    shift-invariant), masking all but the first real key makes the pattern one-hot there, and the record holds
    the edited scores."""
    site = Site(1, "attn", head=2, field="scores")
    capture = Capture(attn={"scores", "pattern", "out"})
    clean = random_model.run(TEXTS, capture=capture)
    shifted = random_model.run(TEXTS, capture=capture, interventions=[Add(site, torch.tensor(3.0))])
    torch.testing.assert_close(shifted.logits, clean.logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(shifted.stream.layers[1].attn.scores[:, 2], clean.stream.layers[1].attn.scores[:, 2] + 3)

    first = run_first = random_model.run(TEXTS, capture=capture, interventions=[
        Hook(site, lambda s, tokens: s.masked_fill(~_first_real_key(tokens, s), float("-inf")))])
    real = first.tokens.attention_mask.bool()  # the rows of real queries, one-hot; padding rows as they were
    pattern = first.stream.layers[1].attn.pattern[:, 2]  # [batch pos key_pos]
    expected = _first_real_key(first.tokens, pattern).to(pattern.dtype)
    assert torch.equal(pattern[real], expected[real])
    assert not torch.allclose(run_first.logits, clean.logits)
    other = first.stream.layers[1].attn.pattern[:, 1]
    torch.testing.assert_close(other, clean.stream.layers[1].attn.pattern[:, 1], atol=1e-6, rtol=1e-5)

    # at one position, and replaced whole: the last query of every prompt reads its first real key alone
    at_last = Site(1, "attn", head=2, field="scores", positions=[-1])
    value = torch.full((len(TEXTS), 1, clean.tokens.ids.shape[1]), float("-inf"))
    value[torch.arange(len(TEXTS)), 0, clean.tokens.padded_index([0])[:, 0]] = 0.0
    replaced = random_model.run(TEXTS, capture=capture, interventions=[Replace(at_last, value)])
    last_row = replaced.stream.layers[1].attn.pattern[:, 2, -1]
    assert torch.equal(last_row, torch.softmax(value[:, 0], -1))
    torch.testing.assert_close(replaced.stream.layers[1].attn.pattern[:, 2, :-1],
                               clean.stream.layers[1].attn.pattern[:, 2, :-1], atol=1e-6, rtol=1e-5)


def _first_real_key(tokens: resid.Tokens, like: torch.Tensor) -> torch.Tensor:
    """[batch pos key_pos]: True at each prompt's first real key, and along the whole row of a padding query (which
    may read only itself: masking the rest would leave it no key)."""
    first = tokens.padded_index([0])[:, 0]
    mask = ~tokens.attention_mask.bool()[:, :, None].expand(like.shape).clone()
    mask[torch.arange(like.shape[0]), :, first] = True
    return mask


def test_projection_edits_reach_the_scores():
    """q_proj is edited before the rotary embedding: zeroing a head's projected query zeroes its rotated query
    (rotary is linear) and flattens its pattern over the keys each query may read."""
    model, ids = make_random_model("llama_gqa"), torch.arange(3, 9)[None]
    site = Site(1, "attn", head=0, field="q_proj")
    run = model.run(ids, capture=Capture(attn={"q", "pattern", "out"}), interventions=[resid.ZeroAblate(site)])
    attn = run.stream.layers[1].attn
    assert not bool(attn.q[:, :, 0].any()) and bool(attn.q[:, :, 1].any())
    causal = torch.ones(6, 6).tril()
    torch.testing.assert_close(attn.pattern[0, 0], causal / causal.sum(-1, keepdim=True), atol=1e-6, rtol=1e-6)


def test_t5_scores_carry_the_relative_bias(tmp_path):
    """T5 (no scaling, a relative position bias): the scores are q k^T plus Hugging Face's compute_bias, -inf
    after each decoder query; the cross-attention's have no bias and no mask."""
    hf = t5(tmp_path, "1.0")
    model = resid.load(tmp_path)
    sources, targets = torch.arange(2, 11)[None], torch.arange(3, 10)[None]
    run = model.run(sources, targets, capture=Capture.all(), encoder_capture=Capture.all())
    stacks = ((run.encoder.stream.layers[0].attn, hf.encoder, 9), (run.stream.layers[0].attn, hf.decoder, 7))
    for attn, stack, n in stacks:
        with torch.no_grad():
            bias = stack.block[0].layer[0].SelfAttention.compute_bias(n, n)
        expected = torch.einsum("bqhd,bkhd->bhqk", attn.q, attn.k) * model.decoder.blocks[0].attn.scale + bias
        if stack is hf.decoder:
            expected = expected.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        torch.testing.assert_close(attn.scores, expected, atol=1e-4, rtol=1e-4)
    cross = run.stream.layers[0].cross
    torch.testing.assert_close(cross.scores, torch.einsum("bqhd,bkhd->bhqk", cross.q, cross.k), atol=1e-4, rtol=1e-4)
    assert torch.equal(torch.softmax(cross.scores, -1, dtype=torch.float32), cross.pattern)
