"""Top-activating contexts equal a brute-force scan of every token; corpora load by clear rules; the
figures and the `resid neurons` command work end to end."""

import json

import pytest
import torch
from bad_option import BAD_OPTION

import resid
from resid.analyses import Execution, corpus, neurons, plots
from resid.analyses.cli.main import main
from resid.analyses.corpus_windows import cut_windows
from resid.analyses.neurons import plots as neuron_plots
from resid.errors import ResidError

TEXTS = [
    "The weather was fine and the garden was green, so we walked to the river and back again.",
    "My neighbour has a cat that sleeps all day.",
    "Numbers such as 12 and 40 appear here.",
    "Short.",
]


def _with_bos(model: resid.Transformer) -> resid.Transformer:
    tok = model.tokenizer
    model.tokenizer = resid.Tokenizer(tok.tokenizer, tok.bos_token_id, True, eos_token_id=tok.eos_token_id)
    return model


def _brute_force(model, texts, layer, window, sign):
    """Every token's coefficient, window by window, each window run alone (no padding)."""
    rows = []
    for w in cut_windows(model, texts, window):
        post = model.run(torch.tensor(w.ids)[None], capture=resid.Capture(mlp={"post"})).stream.layers[layer]
        post = post.mlp.post[0]
        for p in range(int(w.bos), len(w.ids)):
            rows.append((w.doc, w.start + p - int(w.bos), post[p]))
    coefficients = torch.stack([r[2] for r in rows])  # [tokens d_mlp]
    score = {"positive": coefficients, "negative": -coefficients, "abs": coefficients.abs()}[sign]
    return rows, coefficients, score


@pytest.mark.parametrize("sign", ["positive", "abs"])
@pytest.mark.parametrize("bos", [False, True])
def test_top_activating_equals_brute_force(random_model, sign, bos):
    model = _with_bos(random_model) if bos else random_model
    k, layer, window = 5, 1, 9  # windows of 9 tokens: the first two documents are cut into several
    df = neurons.top_activating(model, TEXTS, layers=[layer], k=k, sign=sign, window=window,
                                execution=Execution(batch_size=3))
    rows, coefficients, score = _brute_force(model, TEXTS, layer, window, sign)
    expected = score.topk(k + 1, dim=0)
    assert len(df) == k * model.config.d_mlp and df["rank"].tolist() == list(range(1, k + 1)) * model.config.d_mlp
    found = torch.tensor(df["coefficient"].to_numpy(), dtype=torch.float32).reshape(-1, k).T  # [k d_mlp]
    torch.testing.assert_close(found, coefficients.gather(0, expected.indices[:k]), atol=1e-5, rtol=1e-5)
    # Where the scores are not (nearly) tied, the tokens themselves must match.
    separated = (expected.values[:-1] - expected.values[1:] > 1e-3).all(0).nonzero()[:, 0].tolist()
    assert len(separated) > model.config.d_mlp // 2
    for neuron in separated:
        mine = df[df["neuron"] == neuron]
        assert list(zip(mine["doc"], mine["pos"])) == [rows[i][:2] for i in expected.indices[:k, neuron].tolist()]
    # Batch size and window sorting do not change the result.
    again = neurons.top_activating(model, TEXTS, layers=[layer], k=k, sign=sign, window=window,
                                   execution=Execution(batch_size=64))
    torch.testing.assert_close(again["coefficient"], df["coefficient"], atol=1e-5, rtol=1e-5)


def test_top_activating_columns_and_context(random_model):
    df = neurons.top_activating(random_model, TEXTS, layers=[0, -1], neurons=[3, 5], k=2, context=3, after=2,
                                sign="negative")
    assert list(df.columns) == ["site", "layer", "neuron", "rank", "coefficient", "token_id", "token", "doc", "pos",
                                "context"]
    assert df["layer"].unique().tolist() == [0, 2] and df["neuron"].unique().tolist() == [3, 5]
    assert (df.groupby(["layer", "neuron"])["coefficient"].apply(lambda c: c.is_monotonic_increasing)).all()
    tok = random_model.tokenizer
    for row in df.itertuples():
        ids = tok.encode(TEXTS[row.doc])
        assert ids[row.pos] == row.token_id
        before, after = tok.decode(ids[max(0, row.pos - 3) : row.pos]), tok.decode(ids[row.pos + 1 : row.pos + 3])
        assert row.context == f"{before}⟦{row.token}⟧{after}"
    assert df.attrs["provenance"]["parameters"]["sign"] == "negative"


def test_fewer_tokens_than_k_gives_fewer_rows(random_model):
    df = neurons.top_activating(random_model, ["Short."], layers=[0], neurons=[1], k=10)
    assert df["rank"].tolist() == [1, 2]  # "Short" and "."


def test_corpus_files(tmp_path):
    text = tmp_path / "paragraphs.txt"
    text.write_text("First paragraph,\nstill the first.\n\n\nSecond one.\n")
    assert corpus.load(text) == ["First paragraph,\nstill the first.", "Second one."]
    lines = tmp_path / "lines.txt"
    lines.write_text("one per line\nanother line\n")
    assert corpus.load(str(lines)) == ["one per line", "another line"]
    records = tmp_path / "docs.jsonl"
    records.write_text(json.dumps({"text": "a document", "id": 1}) + "\n\n" + json.dumps({"text": "b"}) + "\n")
    assert corpus.load(records) == ["a document", "b"]
    assert corpus.load(["x", "  ", "y"]) == ["x", "y"]


def test_demo_corpus_is_public_domain_prose():
    texts = corpus.demo(max_documents=50)
    assert len(texts) == 50 and all(isinstance(t, str) and t.strip() for t in texts)
    assert not any("[" in t for t in texts)  # the transcribers' notes are removed
    files = corpus.demo_files()
    assert files[0].name > files[-1].name and all(int(f.name[:4]) >= 1946 for f in files)


def test_corpus_errors(tmp_path, random_model):
    with pytest.raises(ResidError, match="has no non-blank documents"):
        corpus.load([])
    with pytest.raises(ResidError, match="unknown suffix '.csv'"):
        corpus.load(tmp_path / "docs.csv")
    with pytest.raises(ResidError, match="does not exist"):
        corpus.load(tmp_path / "missing.txt")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    with pytest.raises(ResidError, match='line 2 has no string field "text"'):
        corpus.load(bad)
    bad.write_text("not json\n")
    with pytest.raises(ResidError, match="line 1: not valid JSON"):
        corpus.load(bad)
    with pytest.raises(ResidError, match=r"Corpus entries \[1\] are not strings"):
        corpus.load(["fine", 3])
    with pytest.raises(ResidError, match="has no non-blank documents"):
        neurons.top_activating(random_model, ["  ", ""], layers=[0])
    with pytest.raises(BAD_OPTION, match=r"(?s)sign.*'positive', 'negative', 'abs'"):
        neurons.top_activating(random_model, TEXTS, layers=[0], sign="largest")
    with pytest.raises(ResidError, match="window must be an integer of at least 1"):
        neurons.top_activating(random_model, TEXTS, layers=[0], window=0)
    with pytest.raises(ResidError, match=r"Layers \[3\] are out of range"):
        neurons.top_activating(random_model, TEXTS, layers=[3])
    with pytest.raises(ResidError, match="context must be a non-negative number of tokens"):
        neurons.top_activating(random_model, TEXTS, layers=[0], context=-1)


def test_neuron_figures(random_model, tmp_path):
    values = neurons.value_top_tokens(random_model, layers=[1], neurons=[4], k=3)
    contexts = neurons.top_activating(random_model, TEXTS, layers=[1], neurons=[4], k=3)
    card = neuron_plots.neuron_card(values, contexts, 1, 4)
    bars, table = card.data[0], card.data[2]
    assert list(bars.x) == values[values["direction"] == "top"]["value"].tolist()
    assert list(table.cells.values[3]) == contexts["context"].tolist()
    path = plots.save_html(card, tmp_path / "card.html")
    assert path.stat().st_size > 100_000  # plotly.js embedded
    assert len(neuron_plots.value_bars(values, 1, 4).data) == 2
    assert len(neuron_plots.context_table(contexts, 1, 4).data) == 1
    with pytest.raises(ResidError, match="no rows for layer 1, neuron 5"):
        neuron_plots.value_bars(values, 1, 5)


@pytest.mark.slow
def test_cli_neurons(tmp_path, capsys):
    docs = tmp_path / "docs.txt"
    docs.write_text("The city of Paris is in France.\n\nThe state of Iowa grows corn.\n")
    out = tmp_path / "out"
    assert main(["neurons", "top", "--layers", "20", "--neurons", "894", "--corpus", str(docs), "--k", "2",
                 "--quiet", "--out", str(out), "--format", "csv"]) == 0
    printed = capsys.readouterr().out
    assert "L20 N894 #1" in printed and "⟦" in printed
    assert (out / "neuron_contexts.csv").exists() and (out / "neuron_contexts.csv.json").exists()
    assert (out / "neuron_L20_N894.html").exists()
    assert main(["neurons", "values", "--layers", "20", "--neurons", "894", "--k", "3"]) == 0
    assert "L20 N894  top:" in capsys.readouterr().out
    assert main(["neurons", "explain", "The Eiffel Tower is located in the city of", "--layers", "20",
                 "--k", "2"]) == 0
    printed = capsys.readouterr().out
    assert "target ' Paris'" in printed and "   20 magnitude    1    894" in printed
    assert main(["neurons", "edit", "The Eiffel Tower is located in the city of", "--neurons", "20:894",
                 "--scale", "0", "--pos", "-1", "--k", "2"]) == 0
    assert "' Paris'" in capsys.readouterr().out
    assert main(["neurons", "edit", "Hi", "--neurons", "20-894", "--set", "1"]) == 2
    assert "layer:neuron pairs" in capsys.readouterr().err
