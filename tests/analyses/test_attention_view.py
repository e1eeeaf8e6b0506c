"""The attention-pattern view (resid.analyses.attention_view): its patterns are the run's at the prompt's real
tokens, from a Run or from texts alike; bad arguments get one clear error; in a real browser (headless Chromium)
its script draws a thumbnail per head and colours the tokens by where a hovered token reads."""

import json
import re

import headless
import pytest
import torch
from headless import dump_dom
from random_models import make_random_model

import resid
from resid.analyses import attention_view

browser = headless.browser  # the fixture
TEXTS = ["When Mary and John went to the store, John gave a drink to", "The cat sat"]


@pytest.fixture(scope="module")
def model(gpt2_tokenizer) -> resid.Transformer:
    return make_random_model("llama_gqa", gpt2_tokenizer)


def test_the_view_holds_the_runs_pattern_at_the_real_tokens(model) -> None:
    """The short prompt of a left-padded batch: its padding columns are left out, every row sums to 1, and the
    probabilities are the stream's; a view made from the text alone is the same."""
    run = model.run(TEXTS, capture=resid.Capture.all())
    view = attention_view.view(model, run, layer=1, heads=[3, 0], prompt=1)
    real = run.tokens.attention_mask[1]
    want = run.stream.layers[1].attn.pattern[1][[3, 0]][:, real][:, :, real]
    assert view.heads == (3, 0) and view.tokens == tuple(model.to_str_tokens(TEXTS[1]))
    torch.testing.assert_close(view.patterns, want.float(), rtol=0, atol=0)
    torch.testing.assert_close(view.patterns.sum(-1), torch.ones(2, len(view.tokens)), rtol=0, atol=1e-5)
    alone = attention_view.view(model, TEXTS[1], layer=1, heads=[3, 0])
    torch.testing.assert_close(alone.patterns, view.patterns, rtol=1e-4, atol=1e-5)
    assert alone.tokens == view.tokens


@pytest.mark.parametrize("kwargs, message", [
    (dict(layer=7), "out of range: the model has 3 layers"),
    (dict(layer=0, heads=[4]), "head indices in 0..3"),
    (dict(layer=0, heads=[True]), "head indices in 0..3"),
    (dict(layer=0, prompt=2), "prompt index in 0..1"),
])
def test_bad_arguments_get_one_clear_error(model, kwargs, message) -> None:
    with pytest.raises(resid.ResidError, match=re.escape(message)):
        attention_view.view(model, TEXTS, **kwargs)


def test_a_run_without_the_pattern_says_what_to_capture(model) -> None:
    with pytest.raises(resid.ResidError, match=r"was not captured.*Capture\(attn="):
        attention_view.view(model, model.run(TEXTS), layer=0)
    last = model.run(TEXTS, capture=resid.Capture(positions=[-1], attn={"pattern"}))
    with pytest.raises(resid.ResidError, match=r"Capture\(positions=None\)"):
        attention_view.view(model, last, layer=0)


def test_the_page_draws_the_heads_and_colours_tokens_by_a_hovered_query(browser, model, tmp_path) -> None:
    view = attention_view.view(model, TEXTS[0], layer=2)
    page = view.write(tmp_path / "attention.html")
    data = json.loads(re.search(r"class='attention-data'>(.*?)</script>", page.read_text()).group(1))
    assert data["tokens"] == list(view.tokens) and len(data["patterns"]) == model.config.n_heads
    query = len(view.tokens) - 1
    hover = (f"document.querySelectorAll('.thumb')[2].click();"
             f"document.querySelectorAll('.token')[{query}].dispatchEvent(new MouseEvent('mouseenter'));")
    dom = dump_dom(browser, page, hover)
    assert len(re.findall(r"class=\"thumb( on)?\"", dom)) == model.config.n_heads
    assert re.search(r"class=\"thumb on\" data-head=\"2\"", dom)
    shown = [float(p) for p in re.findall(r"class=\"token[^\"]*\" data-pos=\"\d+\"[^>]*data-p=\"([0-9.]+)\"", dom)]
    torch.testing.assert_close(torch.tensor(shown), view.patterns[2, query], rtol=0, atol=1e-4)
    assert "reads, in head 2" in dom
