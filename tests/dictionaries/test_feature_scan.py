"""Top-activating examples of dictionary features equal a brute-force encode of every token (each window run alone
with the dictionaries observed), for SAEs on the residual, on sublayer writes and on z and for a transcoder, on
several families; the histograms count every scanned token once and put each activation in its bin; bad input is
refused clearly."""

from pathlib import Path

import numpy as np
import pytest
import torch
from bad_option import BAD_OPTION
from numerics import TINY
from random_dictionaries import random_dictionary, standard_set
from random_models import make_random_model

import resid
import resid.dictionaries
from resid.analyses import Execution, features
from resid.analyses.corpus_windows import cut_windows
from resid.analyses.features import histogram
from resid.dictionaries import CrossLayerTranscoder
from resid.errors import ResidError

TEXTS = [
    "The weather was fine and the garden was green, so we walked to the river and back again.",
    "My neighbour has a cat that sleeps all day.",
    "Numbers such as 12 and 40 appear here.",
    "Short.",
]
DATA = Path(__file__).resolve().parents[1] / "data" / "dictionaries"
K, WINDOW = 4, 9  # windows of 9 tokens: the first two documents are cut into several


def _with_bos(model: resid.Transformer) -> resid.Transformer:
    tok = model.tokenizer
    model.tokenizer = resid.Tokenizer(tok.tokenizer, tok.bos_token_id, True, eos_token_id=tok.eos_token_id)
    return model


def _brute_force(model, dictionaries, texts, window):
    """[(doc, pos)] of every scanned token and, per dictionary, its activations [tokens feature], each window run
    alone (no padding) with the dictionaries observed."""
    where, acts = [], {d.name: [] for d in dictionaries}
    for w in cut_windows(model, texts, window):
        run = model.run(torch.tensor(w.ids)[None], dictionaries=dictionaries)
        first = int(w.bos)
        where += [(w.doc, w.start + p - first) for p in range(first, len(w.ids))]
        for d in dictionaries:
            acts[d.name].append(run.dictionaries[d.name].acts[0, first:])
    return where, {name: torch.cat(found).float() for name, found in acts.items()}


def test_skip_first_leaves_each_windows_first_position_out(gpt2_tokenizer):
    """A BOS-less model's first token (an attention sink) is no example with skip_first: the ranking is the brute
    force's over every other token, and the histograms count one token fewer per window."""
    model = make_random_model("llama_gqa", gpt2_tokenizer)
    [sae] = standard_set(model)[:1]
    df = features.top_activating(model, sae, TEXTS, k=K, window=WINDOW, skip_first=True)
    every = features.top_activating(model, sae, TEXTS, k=K, window=WINDOW)
    starts = {(w.doc, w.start) for w in cut_windows(model, TEXTS, WINDOW)}
    assert not set(zip(df["doc"], df["pos"], strict=True)) & starts
    assert set(zip(every["doc"], every["pos"], strict=True)) & starts  # without it, first positions rank here
    where, acts = _brute_force(model, [sae], TEXTS, WINDOW)
    kept = torch.tensor([place not in starts for place in where])
    for feature in range(sae.d_sae):
        values = acts[sae.name][kept, feature]
        expected = values[values != 0].sort(descending=True).values[:K]
        got = df[df["feature"] == feature]["activation"].to_numpy()
        torch.testing.assert_close(torch.tensor(got, dtype=torch.float32), expected, **TINY)
    counts = df.attrs["histogram"].groupby("feature")["count"].sum()
    assert (counts == len(where) - len(starts)).all()
    with pytest.raises(BAD_OPTION, match="skip_first"):
        features.top_activating(model, sae, TEXTS, skip_first=1)


@pytest.mark.parametrize("kind", ["llama_gqa", "gpt2_like", "gemma3_like", "neox_parallel"])
@pytest.mark.parametrize("bos", [False, True])
def test_top_activating_equals_brute_force(gpt2_tokenizer, kind, bos):
    model = make_random_model(kind, gpt2_tokenizer)
    model = _with_bos(model) if bos else model
    dictionaries = standard_set(model)
    df = features.top_activating(model, dictionaries, TEXTS, k=K, window=WINDOW, execution=Execution(batch_size=3))
    where, acts = _brute_force(model, dictionaries, TEXTS, WINDOW)
    assert df.attrs["provenance"]["parameters"]["tokens"] == len(where)
    separated_total = 0
    for d in dictionaries:
        mine = df[df["dictionary"] == d.name]
        site = d.point_out.site
        assert (mine["layer"] == site.layer).all()
        assert mine["site"].tolist() == [resid.Site(site.layer, site.part, feature=f).label for f in mine["feature"]]
        a = acts[d.name]  # [tokens feature]
        for feature in range(d.d_sae):
            rows = mine[mine["feature"] == feature]
            on = a[:, feature] != 0  # a feature that is off is no example
            expected = a[on, feature].sort(descending=True).values[:K]
            assert rows["rank"].tolist() == list(range(1, len(expected) + 1))
            torch.testing.assert_close(torch.tensor(rows["activation"].to_numpy(), dtype=torch.float32), expected,
                                       **TINY)
            # Where the activations are not (nearly) tied, the tokens themselves must match.
            values = a[:, feature].masked_fill(~on, -torch.inf)
            top = values.topk(min(K + 1, len(values)))
            gaps = top.values[:-1] - top.values[1:]
            n = len(expected)
            if n and bool((gaps[:n] > 1e-3).all()):
                separated_total += 1
                assert list(zip(rows["doc"], rows["pos"])) == [where[i] for i in top.indices[:n].tolist()]
    assert separated_total > 20
    # The trigger is the token at (doc, pos), marked in its context.
    row = df.iloc[0]
    assert f"⟦{row['token']}⟧" in row["context"]


def test_histograms_count_every_token_in_its_bin(gpt2_tokenizer):
    model = make_random_model("llama_gqa", gpt2_tokenizer)
    sae = random_dictionary(model, "blocks.1.hook_resid_post", seed=1)
    chosen = [0, 3, 7, 11]
    df = features.top_activating(model, sae, TEXTS, features=chosen, k=K, window=WINDOW,
                                 execution=Execution(batch_size=2))
    where, acts = _brute_force(model, [sae], TEXTS, WINDOW)
    hist = df.attrs["histogram"]
    assert sorted(hist["feature"].unique()) == chosen and sorted(df["feature"].unique()) == chosen
    low, high = histogram.edges()
    for feature in chosen:
        values = acts[sae.name][:, feature].numpy()
        rows = hist[hist["feature"] == feature]
        assert rows["count"].sum() == len(where)
        assert rows.loc[(rows["low"] == 0) & (rows["high"] == 0), "count"].item() == (values == 0).sum()
        for value in values[values != 0]:
            inside = rows[(rows["low"] <= value) & (value < rows["high"])]
            assert len(inside) == 1, f"activation {value} is in no bin or in several"
        expected = {}
        for value in values[values != 0]:
            b = int(np.flatnonzero((low <= value) & (value < high))[0])
            expected[(low[b], high[b])] = expected.get((low[b], high[b]), 0) + 1
        found = {(r.low, r.high): r.count for r in rows.itertuples() if not r.low == r.high == 0}
        assert found == expected


def test_bins_hold_each_value_once():
    low, high = histogram.edges()
    given = [-3.0, 0.0, 1e-9, 0.25, 1.0, 7.5, 1e9, -1e-9, 0.0]
    valid = torch.ones(1, len(given), dtype=torch.bool)
    valid[0, -1] = False  # not a scanned token: counted nowhere
    tally = histogram.counts(torch.tensor(given)[None, :, None], valid)[0]
    expected = torch.zeros(histogram.N_BINS, dtype=torch.int64)
    for v in given[:-1]:
        expected[int(np.flatnonzero((low <= v) & (v < high) | (v == 0) & (low == high))[0])] += 1
    assert torch.equal(tally, expected) and tally[histogram.ZERO] == 1 and tally[0] == 0 and tally[-1] == 1


def test_bad_input_is_refused(gpt2_tokenizer):
    model = make_random_model("llama_gqa", gpt2_tokenizer)
    sae = random_dictionary(model, "blocks.1.hook_resid_post", seed=1)
    with pytest.raises(ResidError, match=r"Features \[40\] are not valid features: dictionary .* has 40 features"):
        features.top_activating(model, sae, TEXTS, features=[3, 40])
    with pytest.raises(ResidError, match=r"Two dictionaries are named"):
        features.top_activating(model, [sae, sae], TEXTS)
    with pytest.raises(ResidError, match=r"No dictionary given"):
        features.top_activating(model, [], TEXTS)
    with pytest.raises(ResidError, match=r"takes resid.dictionaries.Dictionary values, got str"):
        features.top_activating(model, ["sae"], TEXTS)
    clt = resid.dictionaries.load(DATA / "circuit_tracer" / "clt")
    assert isinstance(clt, CrossLayerTranscoder)
    with pytest.raises(ResidError, match=r"feature scans take per-layer dictionaries"):
        features.top_activating(model, clt, TEXTS)
    with pytest.raises(BAD_OPTION, match=r"(?s)sign.*'positive', 'negative', 'abs'"):
        features.top_activating(model, sae, TEXTS, sign="largest")
