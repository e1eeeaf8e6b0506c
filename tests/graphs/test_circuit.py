"""From a graph to a circuit: subgraph scores against circuit-tracer's definitions on its committed fixture, the
circuit's supernodes (every pruned feature in one, deterministic), labels read through the model's own views,
necessity and sufficiency against by-hand ablations in the model, the graph's predictions against validate's, the
viewer JSON and its round trip, the report page and the command."""

import argparse
import html
import json

import pytest
import torch
from numerics import TINY
from random_models import make_random_model
from random_transcoders import cross_layer, per_layer
from test_circuit_tracer_reference import REFERENCE, _graph, loaded  # noqa: F401 (the fixture)

from resid.analyses import graphs
from resid.analyses.cli import circuit as circuit_command
from resid.analyses.cli import circuit_graph
from resid.analyses.features.views import decoder_top_tokens, encoder_top_tokens
from resid.analyses.graphs import circuit_report
from resid.analyses.graphs.export import graph_json, read_json
from resid.analyses.graphs.measure import predicted_changes
from resid.analyses.graphs.subgraph import merged_rows, subgraph_scores
from resid.analyses.graphs.validate import predicted_effects
from resid.dictionaries import Splice
from resid.dictionaries.formats import saelens
from resid.errors import ResidError
from resid.interventions import ZeroAblate
from resid.sites import Site

IDS = [11, 5, 7, 2, 9, 31, 3, 17, 4]


@pytest.fixture(scope="module")
def built():
    model = make_random_model("llama_gqa")
    transcoders = per_layer(model, d_sae=40)
    return model, transcoders, graphs.attribute(model, IDS, transcoders)


# --- subgraph scores: circuit-tracer's definitions on its fixture --------------------------------------------------
def test_the_whole_graph_as_circuit_scores_as_the_graph(loaded) -> None:  # noqa: F811
    graph = _graph(loaded, "full")
    everything = torch.arange(graph.n_features)
    replacement, completeness = subgraph_scores(graph, everything)
    assert replacement == pytest.approx(REFERENCE["scores"]["full"]["replacement"], abs=1e-5)
    assert completeness == pytest.approx(REFERENCE["scores"]["full"]["completeness"], abs=1e-5)


def test_the_empty_circuit_leaves_tokens_only_their_direct_share(loaded) -> None:  # noqa: F811
    """With every feature merged into its error node, the logits' influence reaches tokens only by their direct
    edges: replacement = sum_l p_l |A[l, tokens]| / sum_l p_l |A[l, :]| (computed here by hand), and zero when no
    token writes into a logit directly."""
    graph = _graph(loaded, "full")
    replacement, _ = subgraph_scores(graph, torch.zeros(graph.n_features, dtype=torch.bool))
    rows = merged_rows(graph, torch.zeros(graph.n_features, dtype=torch.bool))[graph.n_features:].abs().double()
    tokens = slice(graph.n_features + graph.n_errors, graph.n_features + graph.n_errors + graph.n_pos)
    p = graph.logit_probabilities.double()
    by_hand = float((p * rows[:, tokens].sum(1) / rows.sum(1)).sum() / p.sum())
    assert replacement == pytest.approx(by_hand, abs=1e-6) and 0 < replacement < 1
    cut = graph.rows.clone()
    cut[graph.n_features:, tokens] = 0  # no token -> logit edge
    import dataclasses
    no_direct = dataclasses.replace(graph, rows=cut)
    assert subgraph_scores(no_direct, torch.zeros(graph.n_features, dtype=torch.bool))[0] == pytest.approx(0, abs=1e-7)


def test_a_merged_feature_moves_its_edges_to_its_error_node(loaded) -> None:  # noqa: F811
    graph = _graph(loaded, "full")
    inside = torch.ones(graph.n_features, dtype=torch.bool)
    inside[3] = False
    layer, position = graph.features[3, 0], graph.features[3, 1]
    error = graph.n_features + int(layer) * graph.n_pos + int(position)
    rows = merged_rows(graph, inside)
    torch.testing.assert_close(rows[:, error], graph.rows[:, error] + graph.rows[:, 3] * (torch.arange(len(rows)) != 3))
    assert not bool(rows[:, 3].any()) and not bool(rows[3].any())
    # a circuit of fewer features never has a higher replacement score than the graph here
    assert subgraph_scores(graph, inside)[0] <= graph.scores()[0] + 1e-6


# --- the circuit -------------------------------------------------------------------------------------------------
def test_the_circuit_groups_every_pruned_feature_once_and_deterministically(built) -> None:
    model, transcoders, graph = built
    table = graphs.labels(model, graph, transcoders)
    first = graphs.circuit(graph, 0.8, 0.98, max_supernodes=4, labels=table)
    again = graphs.circuit(graph, 0.8, 0.98, max_supernodes=4, labels=table)
    kept = graph.prune(0.8, 0.98).node_mask[:graph.n_features].nonzero().flatten()
    assert torch.equal(first.nodes, kept) and len(kept) > 4
    members = sorted(i for s in first.supernodes for i in s.nodes)
    assert members == kept.tolist()
    assert len(first.supernodes) == 4
    assert [(s.name, s.nodes, s.reasons) for s in first.supernodes] == \
        [(s.name, s.nodes, s.reasons) for s in again.supernodes]
    assert len({s.name for s in first.supernodes}) == 4 and all(s.reasons for s in first.supernodes)
    influence_of = graph.influence()
    for s in first.supernodes:  # members most influential first; groups by total influence
        values = influence_of[list(s.nodes)]
        assert torch.all(values[:-1] >= values[1:])
        assert s.influence == pytest.approx(float(values.sum()), rel=1e-5)
    assert [s.influence for s in first.supernodes] == sorted((s.influence for s in first.supernodes), reverse=True)
    assert first.scores["graph"] == pytest.approx(graph.scores(), abs=1e-6)
    assert first.scores["circuit"] == subgraph_scores(graph, kept)
    assert first.scores["pruned"] == pytest.approx(graph.pruned(0.8, 0.98).scores(), abs=1e-6)
    frame = first.to_frame()
    assert len(frame) == len(kept) and frame["label"].str.startswith("out: ").all()


def test_average_linkage_merges_the_closest_first() -> None:
    from resid.analyses.graphs.circuit import average_linkage
    d = torch.tensor([[0, 1, 9, 9], [1, 0, 9, 9], [9, 9, 0, 2], [9, 9, 2, 0]], dtype=torch.float32)
    assert average_linkage(d, 2) == [[0, 1], [2, 3]]
    assert average_linkage(d, 3) == [[0, 1], [2], [3]]
    assert average_linkage(d, 1) == [[0, 1, 2, 3]]


def test_average_linkage_equals_the_textbook_loop() -> None:
    """The cached nearest-cluster version merges exactly as the plain O(n^3) loop (argmin over the whole matrix)."""
    import numpy as np

    from resid.analyses.graphs.circuit import average_linkage

    def textbook(d, groups):
        dist = d.double().numpy().copy()
        np.fill_diagonal(dist, np.inf)
        members = {i: [i] for i in range(len(d))}
        while len(members) > groups:
            a, b = divmod(int(np.argmin(dist)), len(d))
            a, b = min(a, b), max(a, b)
            merged = (len(members[a]) * dist[a] + len(members[b]) * dist[b]) / (len(members[a]) + len(members[b]))
            dist[a], dist[:, a] = merged, merged
            dist[a, a] = np.inf
            dist[b], dist[:, b] = np.inf, np.inf
            members[a] = sorted(members[a] + members.pop(b))
        return [members[k] for k in sorted(members)]

    g = torch.Generator().manual_seed(1)
    for n, groups in ((30, 4), (60, 1), (45, 12)):
        x = torch.randn(n, 5, generator=g)
        d = torch.cdist(x, x).round(decimals=1)  # rounded: ties happen
        assert average_linkage(d, groups) == textbook(d, groups)


def test_labels_are_the_feature_views(built) -> None:
    model, transcoders, graph = built
    table = graphs.labels(model, graph, transcoders, k=3)
    assert len(table) == len({(l, f) for l, _, f in graph.features.tolist()})
    row = table.iloc[len(table) // 2]
    d = transcoders[int(row["layer"])]
    out = decoder_top_tokens(model, d, int(row["feature"]), k=3)
    into = encoder_top_tokens(model, d, int(row["feature"]), k=3)
    assert row["outputs"] == list(out[out["direction"] == "top"]["token"])
    assert row["inputs"] == list(into[into["direction"] == "top"]["token"])
    examples = __import__("pandas").DataFrame({"dictionary": [d.name] * 2, "layer": [row["layer"]] * 2,
                                               "feature": [row["feature"]] * 2, "rank": [2, 1],
                                               "context": ["second ⟦x⟧", "a long context before ⟦the⟧ token"]})
    with_ctx = graphs.labels(model, graph, transcoders, examples=examples)
    label = with_ctx.set_index("key").loc[row["key"], "label"]
    assert label.endswith('ctx: "a long context before ⟦the⟧"')


def test_labels_of_a_cross_layer_transcoder() -> None:
    model = make_random_model("llama_gqa")
    clt = cross_layer(model)
    graph = graphs.attribute(model, IDS, clt)
    table = graphs.labels(model, graph, clt, k=2)
    assert len(table) and all(len(o) == 2 and len(i) == 2 for o, i in zip(table["outputs"], table["inputs"]))
    with pytest.raises(ResidError, match="per-layer transcoders only"):
        graphs.measure(model, graphs.circuit(graph), clt)


# --- measured in the model ---------------------------------------------------------------------------------------
def _value(model, graph, transcoders, interventions) -> float:
    run = model.run(graph.token_ids[None], dictionaries=[Splice(d) for d in transcoders],
                    interventions=interventions)
    last = run.logits[0, -1].float()
    return float(last[graph.logit_tokens[0]] - last.mean())


def test_necessity_and_sufficiency_equal_by_hand_ablations(built) -> None:
    model, transcoders, graph = built
    found = graphs.circuit(graph, max_supernodes=3)
    assert len(found.supernodes) == 3
    measured = graphs.measure(model, found, transcoders, steer=3.0)
    by = {(r.intervention, r.supernode): r for r in measured.itertuples()}
    base = by[("none", "")].measured
    assert base == pytest.approx(float(graph.logit_values[0]), abs=1e-4)  # the splices keep the run exact

    def sites(nodes):
        return [Site(int(l), "mlp", feature=int(f), positions=(int(p),)) for l, p, f in graph.features[nodes].tolist()]

    ablated = _value(model, graph, transcoders, [ZeroAblate(s) for s in sites(found.nodes)])
    assert by[("ablate circuit", "")].measured == pytest.approx(ablated, abs=1e-4)
    assert measured.attrs["necessity"] == pytest.approx(1 - ablated / base, abs=1e-4)
    # every feature outside the circuit, at every position, active or not: a Hook on each dictionary's features
    inside = {(int(l), int(p), int(f)) for l, p, f in graph.features[found.nodes].tolist()}
    keep = []
    for layer, d in enumerate(transcoders):
        mask = torch.zeros(graph.n_pos, d.d_sae)
        for l, p, f in inside:
            if l == layer:
                mask[p, f] = 1
        keep.append(mask)
    from resid.interventions import Hook
    outside = [Hook(Site(layer, "mlp", feature=f), (lambda m: lambda a, tokens: a * m)(keep[layer][:, f]))
               for layer, d in enumerate(transcoders) for f in range(d.d_sae)]
    kept = _value(model, graph, transcoders, outside)
    assert by[("ablate outside", "")].measured == pytest.approx(kept, abs=1e-4)
    assert measured.attrs["sufficiency"] == pytest.approx(kept / base, abs=1e-4)
    s = found.supernodes[0]
    one = _value(model, graph, transcoders, [ZeroAblate(x) for x in sites(list(s.nodes))])
    assert by[("ablate", s.name)].measured == pytest.approx(one, abs=1e-4)
    from resid.interventions import Scale
    steered = _value(model, graph, transcoders, [Scale(x, 3.0) for x in sites(list(s.nodes))])
    assert by[("steer", s.name)].measured == pytest.approx(steered, abs=1e-4)


def test_the_prediction_of_one_ablation_is_validates(built) -> None:
    _, _, graph = built
    scale = torch.ones(3, graph.n_features)
    for k, node in enumerate((0, 5, graph.n_features - 1)):
        scale[k, node] = 0
    expected = -predicted_effects(graph, [0, 5, graph.n_features - 1])[:, 0]
    torch.testing.assert_close(predicted_changes(graph, scale), expected, rtol=1e-4, atol=1e-5)
    assert float(predicted_changes(graph, torch.ones(1, graph.n_features))[0]) == 0.0


# --- export, viewer, report, command -----------------------------------------------------------------------------
def test_the_json_carries_the_circuit_and_reads_back(built, tmp_path) -> None:
    model, transcoders, graph = built
    table = graphs.labels(model, graph, transcoders)
    found = graphs.circuit(graph, labels=table, max_supernodes=3)
    data = graph_json(graph, "g", circuit=found)
    assert data["qParams"]["supernodes"] == [[name, *ids] for name, ids in found.groups()]
    assert data["qParams"]["pinnedIds"] == found.node_ids()
    features = [n for n in data["nodes"] if n["feature_type"] == "cross layer transcoder"]
    assert features and all(n["clerp"].startswith("out: ") for n in features)
    assert data["metadata"]["resid"]["circuit"]["scores"]["circuit"] == list(found.scores["circuit"])
    path = graphs.write_json(graph, tmp_path / "g.json", circuit=found)
    back = read_json(path)
    pruned = graph.pruned(0.8, 0.98)
    assert torch.equal(back.token_ids, graph.token_ids) and torch.equal(back.features, pruned.features)
    torch.testing.assert_close(back.rows, pruned.rows, **TINY)
    torch.testing.assert_close(back.logit_probabilities, graph.logit_probabilities)
    assert back.scores() == pytest.approx(pruned.scores(), abs=1e-6)


def test_the_report_and_the_command(built, tmp_path) -> None:
    model, transcoders, graph = built
    found = graphs.circuit(graph, max_supernodes=3)
    arrows = circuit_report.flows(found)
    into = found.supernodes[0]
    logit = arrows[(arrows["source"] == into.name) & arrows["target"].str.startswith("logit")]
    assert float(logit["weight"].iloc[0]) == pytest.approx(float(graph.rows[graph.n_features, list(into.nodes)].sum()),
                                                           rel=1e-5)
    page = circuit_report.write(model, found, tmp_path / "report.html",
                                measured=graphs.measure(model, found, transcoders))
    text = page.read_text()
    assert "Necessity" in text and all(html.escape(s.name) in text for s in found.supernodes)
    # the command, from the graph's JSON and its transcoders (a folder of per-layer folders)
    folder = tmp_path / "tcs"
    for d in transcoders:
        saelens.write(d, folder / d.name)
    json_path = graphs.write_json(graph, tmp_path / "g.json")
    parser = argparse.ArgumentParser()  # `resid circuit`'s own parser (edges by default, a graph's with --graph)
    circuit_command.add_parser(parser.add_subparsers(dest="command"), argparse.ArgumentParser(add_help=False))
    parse = lambda *words: parser.parse_args(["circuit", *words])  # noqa: E731
    args = parse("--graph", str(json_path), "--transcoders", str(folder), "--max-supernodes", "3",
                 "--out", str(tmp_path / "out"))
    circuit_command.check(args)
    said = circuit_command.run(model, args)
    assert "necessity" in said and "supernode" in said
    written = json.loads((tmp_path / "out" / "circuit.json").read_text())
    assert len(written["qParams"]["supernodes"]) == 3
    assert (tmp_path / "out" / "circuit.html").is_file() and (tmp_path / "out" / "report.html").is_file()
    with pytest.raises(ResidError, match="--graph g.json"):
        circuit_graph.check(parse())
    with pytest.raises(ResidError, match="--transcoders"):
        circuit_command.check(parse("--prompt", "hi"))
    with pytest.raises(ResidError, match="not both"):
        circuit_command.check(parse("--prompt", "hi", "--pairs", "p.jsonl"))

