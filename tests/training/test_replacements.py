"""evaluate_replacements on a tiny random model: a cross-layer transcoder whose decoders write only into their own
layer is the per-layer transcoders it was built from, so every score agrees; per layer the FVU and L0 are
`evaluate`'s; the zero ablation does not depend on the dictionaries; the graph scores are the graphs' own; the
whole replacement compounds errors (its CE differs from a single splice's); bad input is refused."""

import pytest
import random_transcoders
import torch

import resid
from resid.analyses.distributed.execution import Execution
from resid.analyses.graphs import attribute
from resid.analyses.training import evaluate, evaluate_replacements
from resid.dictionaries import CrossLayerTranscoder, check

QUIET = Execution(batch_size=4, progress=False)
PROMPTS = ["The cat sat on the", "When Mary and John went to the store, John gave a drink to"]
OPTIONS = dict(max_windows=6, window=24, execution=QUIET)


def _as_clt(model, transcoders) -> CrossLayerTranscoder:
    """A CLT whose layer-l features are transcoder l's, writing only into layer l."""
    n = len(transcoders)
    W_dec = []
    for layer, d in enumerate(transcoders):
        w = torch.zeros(d.d_sae, n - layer, d.d_out)
        w[:, 0] = d.W_dec.detach()
        W_dec.append(w)
    stack = lambda field: torch.stack([getattr(d, field).detach() for d in transcoders])  # noqa: E731
    return check(CrossLayerTranscoder(
        W_enc=stack("W_enc"), b_enc=stack("b_enc"), W_dec=W_dec, b_dec=stack("b_dec"), activation="jumprelu",
        threshold=stack("threshold"), hook_in="ln2.hook_normalized", hook_out="hook_mlp_out", name="diagonal"), model)


@pytest.fixture(scope="module")
def transcoders(bos_model):
    return random_transcoders.per_layer(bos_model, d_sae=24, skip_layer=None, activation="jumprelu")


@pytest.fixture(scope="module")
def scores(bos_model, texts, transcoders):
    replacements = {"per-layer": transcoders, "diagonal": _as_clt(bos_model, transcoders),
                    "clt": random_transcoders.cross_layer(bos_model)}
    return evaluate_replacements(bos_model, replacements, texts, prompts=PROMPTS, keep_graphs=True, **OPTIONS)


def test_a_clt_writing_only_into_its_own_layer_scores_as_the_per_layer_transcoders(scores) -> None:
    table = scores.table.set_index("replacement")
    assert list(table["kind"]) == ["per-layer", "cross-layer", "cross-layer"]
    columns = ["features", "tokens", "fvu", "l0", "dead_fraction", "ce_clean", "ce_spliced", "ce_zero_ablated",
               "ce_loss_recovered", "kl_spliced", "replacement_score", "completeness_score", "graph_features"]
    for column in columns:
        assert table.loc["diagonal", column] == pytest.approx(table.loc["per-layer", column], rel=1e-4, abs=1e-6), \
            column
    # the random CLT is another replacement: its numbers differ
    assert table.loc["clt", "ce_spliced"] != pytest.approx(table.loc["per-layer", "ce_spliced"], rel=1e-3)
    # zeroing every MLP write does not depend on what would have replaced it
    assert float(table["ce_zero_ablated"].max() - table["ce_zero_ablated"].min()) < 1e-5
    for column in ("replacement_score", "completeness_score"):
        assert all(0 <= v <= 1 for v in table[column]), column


def test_per_layer_scores_are_evaluates_and_the_graph_scores_the_graphs(bos_model, texts, transcoders, scores):
    single = evaluate(bos_model, transcoders, texts, **OPTIONS)
    layers = scores.per_layer[scores.per_layer["replacement"] == "per-layer"]
    for column in ("fvu", "l0", "dead_fraction", "dense_fraction"):
        torch.testing.assert_close(torch.tensor(layers[column].to_numpy()), torch.tensor(single[column].to_numpy()),
                                   rtol=1e-5, atol=1e-7)
    row = scores.table.set_index("replacement").loc["per-layer"]
    assert row["l0"] == pytest.approx(single["l0"].sum(), rel=1e-5)
    # replacing every MLP at once is not any one splice: later transcoders read the spliced stream
    assert all(abs(row["ce_spliced"] - v) > 1e-4 for v in single["ce_spliced"])
    graph = attribute(bos_model, PROMPTS[1], transcoders)
    assert scores.graphs["per-layer"][1].scores() == pytest.approx(graph.scores(), rel=1e-5)
    mean = [sum(g.scores()[i] for g in scores.graphs["clt"]) / 2 for i in (0, 1)]
    assert [row for row in scores.table.set_index("replacement").loc["clt", ["replacement_score",
            "completeness_score"]]] == pytest.approx(mean, rel=1e-6)


@pytest.mark.parametrize("replacements, prompts, message", [
    ({}, (), "at least one replacement"),
    ("half", (), r"no transcoder replaces layer\(s\) \[1, 2\]"),
    ("whole", ("",), "non-empty texts"),
])
def test_bad_input_is_refused_saying_what_to_give(bos_model, texts, transcoders, replacements, prompts, message):
    if replacements == "half":
        replacements = {"half": transcoders[:1]}
    elif replacements == "whole":
        replacements = {"whole": transcoders}
    with pytest.raises(resid.ResidError, match=message):
        evaluate_replacements(bos_model, replacements, texts, prompts=prompts, **OPTIONS)
