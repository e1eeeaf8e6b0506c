"""A feature's card shows what the scan and the views computed: its top context first with the activating token
highlighted (escaped), a histogram whose bars count every scanned token once, and the decoder's promoted and
suppressed tokens of features.views; it is written to HTML, and a feature that was not scanned is refused."""

import html

import pytest
from random_dictionaries import random_dictionary
from random_models import make_random_model

from resid.analyses import features, plots
from resid.analyses.features.cards import highlight
from resid.analyses.features.views import decoder_top_tokens
from resid.errors import ResidError

TEXTS = [
    "The weather was fine and the garden was green, so we walked to the river and back again.",
    "My neighbour has a cat that sleeps all day <b>really</b> & more.",
    "Numbers such as 12 and 40 appear here.",
]


@pytest.fixture(scope="module")
def scanned(gpt2_tokenizer):
    model = make_random_model("gemma3_like", gpt2_tokenizer)  # post-norms and a final norm gain to fold in
    sae = random_dictionary(model, "blocks.1.hook_resid_post", seed=1)
    table = features.top_activating(model, sae, TEXTS, features=[2, 5, 9], k=6, window=12)
    return model, sae, table


def test_card_shows_the_scan_and_the_views(scanned, tmp_path):
    model, sae, table = scanned
    feature = int(table["feature"].iloc[0])
    fig = features.card(model, sae, feature, table, k=7)
    rows = table[table["feature"] == feature].sort_values("rank")
    contexts = fig.data[0]
    assert contexts.type == "table"
    first = contexts.cells.values[2][0]
    token = html.escape(rows["token"].iloc[0])
    assert f"<b><span style='color:#b2182b'>{token}</span></b>" in first
    assert list(contexts.cells.values[0]) == rows["rank"].tolist()
    shades = [float(c.rsplit(",", 1)[1].rstrip(")")) for c in contexts.cells.fill.color[1]]  # the activation column
    assert shades[0] == pytest.approx(0.6) and shades == sorted(shades, reverse=True) and shades[-1] < shades[0]
    bars = [t for t in fig.data if t.type == "bar" and t.name in ("off", "active")]
    scanned_tokens = table.attrs["provenance"]["parameters"]["tokens"]
    assert sum(sum(t.y) for t in bars) == scanned_tokens
    assert sum(t.y[0] for t in bars if t.name == "off") + len(rows) <= scanned_tokens
    views = decoder_top_tokens(model, sae, feature, k=7)
    for direction in ("top", "bottom"):
        trace = next(t for t in fig.data if t.name == direction)
        expected = views[views["direction"] == direction].sort_values("rank")
        if direction == "bottom":
            expected = expected.iloc[::-1]
        assert list(trace.y) == [f"{t!r} ({i})" for t, i in zip(expected["token"], expected["token_id"])]
        assert list(trace.x) == pytest.approx(expected["value"].tolist())
    assert f"feature[{feature}]" in fig.layout.title.text and f"of {scanned_tokens}" in fig.layout.title.text
    axis = fig.layout.xaxis  # the histogram's: a few short, level labels, each naming a bin that is drawn
    drawn = [x for t in bars for x in t.x]
    assert 2 <= len(axis.ticktext) <= 6 and all(len(text) <= 7 for text in axis.ticktext) and axis.tickangle == 0
    assert set(axis.tickvals) <= set(drawn) and axis.tickvals[0] == drawn[0] and axis.tickvals[-1] == drawn[-1]
    page = plots.save_html(fig, tmp_path / "card.html")
    assert "#b2182b" in page.read_text()


def test_context_text_is_escaped_and_the_trigger_marked():
    shown = highlight("a <b>cat</b> &⟦ dog⟧ <i>")
    assert shown == "a &lt;b&gt;cat&lt;/b&gt; &amp;<b><span style='color:#b2182b'> dog</span></b> &lt;i&gt;"


def test_a_feature_that_was_not_scanned_is_refused(scanned):
    model, sae, table = scanned
    with pytest.raises(ResidError, match=r"Feature 3 of dictionary .* was not scanned"):
        features.card(model, sae, 3, table)
    bare = table.copy()
    bare.attrs = {}
    with pytest.raises(ResidError, match=r"no activation histogram"):
        features.card(model, sae, 2, bare)
    with pytest.raises(ResidError, match=r"Features \[40\] are not valid"):
        features.card(model, sae, 40, table)


@pytest.mark.parametrize("damage, message", [
    (lambda table, hist: table.__setitem__("activation", table["activation"].where(table["rank"] != 1)),
     r"The table's rows of feature \d+: 1 non-finite activation value\(s\) \(e.g. nan\); a card shows numbers only"),
    (lambda table, hist: hist.__setitem__("count", hist["count"].astype(float).where(hist["low"] != 0)),
     r"The activation histogram of feature \d+: 1 non-finite count value\(s\)"),
    (lambda table, hist: hist.__setitem__("low", hist["low"].where(hist["low"] == 0, 0.123)),
     r"The activation histogram of feature \d+: rows that are not counts of its fixed bins \(e.g. low, high = "
     r"\(0.123, "),
])
def test_a_card_of_a_damaged_table_is_one_clear_error(scanned, damage, message):
    model, sae, table = scanned
    feature = int(table["feature"].iloc[0])
    table, histogram = table.copy(), table.attrs["histogram"].copy()
    damage(table, histogram)
    with pytest.raises(ResidError, match=message):
        features.card(model, sae, feature, table, histogram=histogram)
