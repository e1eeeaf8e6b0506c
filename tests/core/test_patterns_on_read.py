"""Attention scores and patterns given on read: a capture that asks for them keeps the queries and keys (and the
pass's shared masks), and the record forms them on the first read, the same tensor afterwards. They equal what the
forward forms itself (the explicit path, forced here by an edit of the scores that changes nothing) on every
attention variant, at the kept query positions of Capture(positions=...), from the q and k the forward used (edits
included); where the forward forms them (soft caps, edited scores or pattern) the record holds what it used."""

import pytest
import torch
from encoder_models import build
from moe_models import make_deepseek_model
from random_models import RANDOM_CONFIGS, make_random_model
from seq2seq_models import vanilla
from t5_models import t5

import resid
from resid import Add, Capture, Replace, Site
from resid.components.attention import ScoreInputs

# float32 rounding: the formed run computes z by another kernel, so later layers read inputs that differ by it,
# and the kept rows alone are a matmul of other sizes
TOL = dict(atol=1e-4, rtol=1e-4)
PAD = 0


def _ids(seed: int, shape: tuple[int, int], vocab: int) -> torch.Tensor:
    return torch.randint(5, vocab, shape, generator=torch.Generator().manual_seed(seed))


def _padded(ids: torch.Tensor, lengths: list[int], side: str = "left") -> resid.Tokens:
    return resid.Tokens.pad([row[:n].tolist() for row, n in zip(ids, lengths, strict=True)], PAD, side)


def _formed(part: str, layers: range) -> list[Add]:
    """Edits that change no number but make every layer's forward form its scores and pattern itself."""
    return [Add(Site(layer, part, field="scores"), torch.tensor(0.0)) for layer in layers]


def _assert_scores_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    blocked = torch.isneginf(expected)
    assert torch.equal(torch.isneginf(actual), blocked), "-inf exactly where the forward blocks a key"
    torch.testing.assert_close(actual[~blocked], expected[~blocked], **TOL)


def _assert_records_equal(given, formed, fields=("scores", "pattern")) -> None:
    for name in fields:
        actual, expected = getattr(given, name), getattr(formed, name)
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, name
        if name == "scores":
            _assert_scores_close(actual, expected)
        else:
            torch.testing.assert_close(actual, expected, **TOL)


def _decoder_models() -> dict:
    models = {kind: make_random_model(kind) for kind in sorted(RANDOM_CONFIGS)}
    models["deepseek_latent"] = make_deepseek_model()
    models["llama_window"] = make_random_model("llama_gqa", sliding_window=3,
                                               layer_types=("sliding", "full", "sliding"))
    return models


MODELS = _decoder_models()


@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize("padded", [False, True])
def test_given_on_read_equals_formed(kind, padded):
    """Every layer's scores and pattern, read from a full capture, equal those the forward forms: MHA, GQA,
    parallel blocks, learned positions, q/k norms (per head and over all heads), soft caps, sliding windows with and
    without padding, latent attention."""
    model = MODELS[kind]
    ids = _ids(1, (3, 9), model.config.d_vocab)
    inputs = _padded(ids, [9, 5, 7]) if padded else ids
    layers = range(model.config.n_layers)
    given = model.run(inputs, capture=Capture.all())
    formed = model.run(inputs, capture=Capture.all(), interventions=_formed("attn", layers))
    torch.testing.assert_close(given.logits, formed.logits, **TOL)
    for layer in layers:
        _assert_records_equal(given.stream.layers[layer].attn, formed.stream.layers[layer].attn)


def test_formed_on_first_read_once(monkeypatch):
    """The run forms no scores; a first read forms its layer's scores once, every later read gives the same
    tensor. A pattern read after its scores is their softmax; a pattern read first forms scores of its own and
    does not keep them (reading every pattern of a full capture holds no scores)."""
    model = MODELS["llama_gqa"]
    calls = []
    original = ScoreInputs.scores

    def counted(self):
        calls.append(self)
        return original(self)

    monkeypatch.setattr(ScoreInputs, "scores", counted)
    run = model.run(_padded(_ids(2, (2, 8), model.config.d_vocab), [8, 4]), capture=Capture.all())
    assert calls == []
    attn = run.stream.layers[1].attn
    scores = attn.scores
    pattern = attn.pattern
    assert len(calls) == 1 and attn.scores is scores
    assert attn.pattern is pattern and run.read(Site(1, "attn", field="pattern")) is pattern
    assert torch.equal(pattern, torch.softmax(scores, -1, dtype=torch.float32))
    assert torch.equal(run.read(Site(1, "attn", head=2, field="pattern")), pattern[:, 2])
    first = run.stream.layers[2].attn.pattern
    assert len(calls) == 2
    assert torch.equal(first, torch.softmax(run.stream.layers[2].attn.scores, -1, dtype=torch.float32))
    assert len(calls) == 3  # formed again: the pattern did not keep them
    only = model.run(run.tokens, capture=Capture(attn={"pattern"}))
    assert torch.equal(only.stream.layers[1].attn.pattern, pattern) and len(calls) == 4
    with pytest.raises(resid.ResidError, match=r"attn\.scores was not captured"):
        only.stream.layers[1].attn.scores  # noqa: B018
    with pytest.raises(resid.ResidError, match=r"attn\.q was not captured"):  # kept for the pattern, not given
        only.stream.layers[1].attn.q  # noqa: B018


@pytest.mark.parametrize("kind", ["llama_gqa", "llama_window", "deepseek_latent", "gpt2_like"])
@pytest.mark.parametrize("positions", [[-1], [0, 3, -2], [[1, -1], [0, 2]]])
def test_kept_positions_give_the_kept_rows(kind, positions):
    """Capture(positions=...) keeps some query positions: the pattern given on read is their rows, every key."""
    model = MODELS[kind]
    tokens = _padded(_ids(3, (2, 8), model.config.d_vocab), [8, 5])
    full = model.run(tokens, capture=Capture(attn={"scores", "pattern"}))
    kept = model.run(tokens, capture=Capture(attn={"scores", "pattern"}, positions=positions))
    index = kept.stream.captured  # [batch k] padded positions
    for full_layer, kept_layer in zip(full.stream.layers, kept.stream.layers, strict=True):
        for name in ("scores", "pattern"):
            value = getattr(full_layer.attn, name)
            rows = value.gather(2, index[:, None, :, None].expand(-1, value.shape[1], -1, value.shape[3]))
            actual = getattr(kept_layer.attn, name)
            assert actual.shape == rows.shape
            _assert_scores_close(actual, rows) if name == "scores" else torch.testing.assert_close(actual, rows, **TOL)


def test_edited_queries_and_keys_reach_the_pattern():
    """The pattern on read is formed from the q and k the forward used: an edit of a head's query and of a key
    head shows in it, as in the pattern the forward forms."""
    model = MODELS["llama_gqa"]
    ids = _ids(4, (2, 7), model.config.d_vocab)
    edits = [Add(Site(1, "attn", head=0, field="q"), torch.tensor(0.7)),
             Replace(Site(1, "attn", kv_head=1, field="k"), torch.ones(2, 7, 8))]
    clean = model.run(ids, capture=Capture(attn={"pattern"}))
    given = model.run(ids, capture=Capture(attn={"pattern", "scores"}), interventions=edits)
    formed = model.run(ids, capture=Capture(attn={"pattern", "scores"}), interventions=[*edits, *_formed("attn", [1])])
    _assert_records_equal(given.stream.layers[1].attn, formed.stream.layers[1].attn)
    assert not torch.allclose(given.stream.layers[1].attn.pattern, clean.stream.layers[1].attn.pattern)
    # under GQA, kv head 1 is read by query heads 2 and 3: equal keys make their rows uniform over what they read
    causal = torch.ones(7, 7).tril()
    torch.testing.assert_close(given.stream.layers[1].attn.pattern[:, 2:], (causal / causal.sum(-1, keepdim=True))
                               .expand(2, 2, 7, 7), **TOL)


def test_an_edited_pattern_is_what_is_read():
    """An edited pattern is formed by the forward, edit included, and that is the record's."""
    model = MODELS["llama_gqa"]
    ids = _ids(5, (1, 6), model.config.d_vocab)
    uniform = torch.ones(6, 6).tril() / torch.arange(1, 7)[:, None]
    run = model.run(ids, capture=Capture(attn={"pattern", "scores"}),
                    interventions=[Replace(Site(2, "attn", head=1, field="pattern"), uniform[None])])
    assert torch.equal(run.stream.layers[2].attn.pattern[0, 1], uniform)
    clean = model.run(ids, capture=Capture(attn={"pattern", "scores"}))
    _assert_scores_close(run.stream.layers[2].attn.scores, clean.stream.layers[2].attn.scores)  # before the edit


def test_bidirectional_encoder(tmp_path):
    """BERT-like: every key readable but padding; the padded batch's patterns, read, equal the formed ones."""
    build("bert_base", tmp_path)
    model = resid.load(tmp_path)
    tokens = _padded(_ids(6, (2, 9), model.config.d_vocab), [9, 6], side="right")
    given = model.run(tokens, capture=Capture.all())
    layers = range(model.config.n_layers)
    formed = model.run(tokens, capture=Capture.all(), interventions=_formed("attn", layers))
    for layer in layers:
        _assert_records_equal(given.stream.layers[layer].attn, formed.stream.layers[layer].attn)
    assert bool((given.stream.layers[0].attn.pattern[0, :, :, 6:] > 0).all())  # after the query: read too


@pytest.mark.parametrize("model_of", ["vanilla", "t5"])
def test_encoder_decoder(model_of, tmp_path):
    """Encoder-decoder models: the encoder's bidirectional self-attention, the decoder's causal self-attention
    (T5: with the relative position bias) and its cross-attention over a padded source, read and formed alike,
    at every position and at the kept ones."""
    if model_of == "t5":
        t5(tmp_path, "1.1")
        model = resid.load(tmp_path)
    else:
        model = vanilla()[1]
    vocab = model.decoder.config.d_vocab
    source = _padded(_ids(7, (2, 9), vocab), [9, 5], side="right")
    target = _ids(8, (2, 6), vocab)
    layers = range(model.decoder.config.n_layers)
    capture = Capture.all()
    given = model.run(source, target, capture=capture, encoder_capture=capture)
    edits = [*_formed("attn", layers), *_formed("cross", layers)]
    encoder_edits = _formed("attn", range(model.encoder.config.n_layers))
    formed = model.run(source, target, capture=capture, encoder_capture=capture, interventions=edits,
                       encoder_interventions=encoder_edits)
    for layer in layers:
        _assert_records_equal(given.stream.layers[layer].attn, formed.stream.layers[layer].attn)
        _assert_records_equal(given.stream.layers[layer].cross, formed.stream.layers[layer].cross)
    for layer in range(model.encoder.config.n_layers):
        _assert_records_equal(given.encoder.stream.layers[layer].attn, formed.encoder.stream.layers[layer].attn)
    assert bool((given.stream.layers[0].cross.pattern[1, :, :, 5:] == 0).all())  # the source's padding
    last = model.run(source, target, capture=Capture(attn={"pattern"}, cross={"pattern"}, positions=[-1]))
    for name in ("attn", "cross"):
        torch.testing.assert_close(getattr(last.stream.layers[1], name).pattern,
                                   getattr(given.stream.layers[1], name).pattern[:, :, -1:], **TOL)


def test_half_precision_keeps_the_model_dtype():
    """In bfloat16 the scores are in the model dtype and the pattern is the float32 softmax cast to it, as formed."""
    model = make_random_model("llama_gqa").to(torch.bfloat16)
    ids = _ids(9, (2, 7), model.config.d_vocab)
    given = model.run(ids, capture=Capture(attn={"scores", "pattern"}))
    formed = model.run(ids, capture=Capture(attn={"scores", "pattern"}), interventions=_formed("attn", [0]))
    attn = given.stream.layers[0].attn
    assert attn.scores.dtype == attn.pattern.dtype == torch.bfloat16
    assert torch.equal(attn.pattern, formed.stream.layers[0].attn.pattern)  # layer 0 reads the same q and k
    assert torch.equal(attn.pattern, torch.softmax(attn.scores, -1, dtype=torch.float32).to(torch.bfloat16))
