"""The three neuron tables (values, keys, sub-updates) carry each neuron's Site in a `site` column, as every table
does (so they join with ablation on neuron sites), and take neurons as resid.Sites or labels: the rows of the sites
named, equal to the rows the index shorthand gives for them."""

import numpy as np
import pandas as pd
import pytest
from random_models import make_random_model
from tiny_fixtures import Tiny

from resid.analyses import ablation, neurons
from resid.analyses.neurons.selection import site_column
from resid.errors import ResidError
from resid.sites import Site

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hello there, general Kenobi, you are a bold one."]


@pytest.fixture
def model(gpt2_tokenizer):
    return make_random_model("llama_gqa", gpt2_tokenizer)


def _sites_match_columns(df: pd.DataFrame) -> None:
    for row in df.drop_duplicates("site").itertuples():
        expert = getattr(row, "expert", None)
        assert Site.parse(row.site) == Site(row.layer, "mlp", neuron=row.neuron, expert=expert)


def _without_site(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns="site").reset_index(drop=True)


def test_values_of_sites_are_the_rows_of_the_shorthand(model):
    chosen = [Site(0, "mlp", neuron=3), "layers[-1].mlp.neuron[5]"]  # a Site and a label (negative layer: resolved)
    df = neurons.value_top_tokens(model, neurons=chosen, k=3)
    last = model.config.n_layers - 1
    assert df["site"].unique().tolist() == ["layers[0].mlp.neuron[3]", f"layers[{last}].mlp.neuron[5]"]
    _sites_match_columns(df)
    grid = neurons.value_top_tokens(model, layers=[0, last], neurons=[3, 5], k=3)
    _sites_match_columns(grid)
    assert grid["site"].nunique() == 4
    expected = grid[grid["site"].isin(df["site"].unique())]
    pd.testing.assert_frame_equal(_without_site(df), _without_site(expected))
    assert df.attrs["provenance"]["parameters"]["neurons"] == ["layers[0].mlp.neuron[3]",
                                                               f"layers[{last}].mlp.neuron[5]"]


def test_top_activating_of_sites_are_the_rows_of_the_shorthand(model):
    df = neurons.top_activating(model, TEXTS, neurons=["layers[1].mlp.neuron[2]"], k=3)
    assert set(df["site"]) == {"layers[1].mlp.neuron[2]"} and len(df) == 3
    grid = neurons.top_activating(model, TEXTS, layers=[1], neurons=[2, 4], k=3)
    _sites_match_columns(grid)
    pd.testing.assert_frame_equal(_without_site(df), _without_site(grid[grid["neuron"] == 2]))
    every = neurons.top_activating(model, TEXTS, layers=[1], neurons="neuron", k=1)  # the word: all of them
    assert every["site"].nunique() == model.config.d_mlp


def test_sub_updates_name_their_neurons_and_join_with_ablation(model):
    df = neurons.sub_updates(model, TEXTS[0], layers=[0], k=2, target=" dog")
    _sites_match_columns(df)
    sites = df["site"].unique().tolist()
    swept = ablation.sweep(model, [TEXTS[0]], [" dog"], sites=sites, method="zero")
    joined = df.merge(swept[["site", "delta"]], on="site")  # one address: the tables join on it
    assert len(joined) == len(df) and joined["delta"].notna().all()


@pytest.mark.parametrize("tiny", ["mixtral"], indirect=True)
def test_experts_are_named_in_the_site(tiny: Tiny):
    model = tiny.model
    df = neurons.value_top_tokens(model, neurons=[Site(1, "mlp", expert=2, neuron=7)], k=2)
    assert df["site"].unique().tolist() == ["layers[1].mlp.expert[2].neuron[7]"]
    assert (df["expert"] == 2).all() and (df["neuron"] == 7).all()
    _sites_match_columns(df)


@pytest.mark.parametrize("neurons_, layers, message", [
    ([Site(0, "mlp", neuron=1)], [0], "leave layers=None"),
    ([Site(0, "attn", head=1)], None, "is not a neuron"),
    (["layers[0].mlp.neuron[1].pre"], None, "is not a neuron"),
    ("head", None, "the word they take is 'neuron'"),
    ([Site(0, "mlp", neuron=1), 3], None, "mixes resid.Sites and indices"),
    ([Site(0, "mlp", neuron=10_000)], None, "out of range"),
])
def test_bad_neuron_sites_say_what_to_pass(model, neurons_, layers, message):
    with pytest.raises(ResidError, match=message):
        neurons.value_top_tokens(model, layers=layers, neurons=neurons_, k=2)


def test_the_site_column_holds_each_rows_site_label():
    layer, neuron, expert = np.array([2, 0, 0, 2]), np.array([999, 3, 10, 0]), np.array([1, 0, 0, 1])
    expected = [Site(int(l), "mlp", neuron=int(i)).label for l, i in zip(layer, neuron) for _ in range(2)]
    assert list(site_column(layer, neuron, repeat=2)) == expected
    with_experts = [Site(int(l), "mlp", expert=int(e), neuron=int(i)).label for l, e, i in zip(layer, expert, neuron)]
    assert list(site_column(layer, neuron, expert)) == with_experts
