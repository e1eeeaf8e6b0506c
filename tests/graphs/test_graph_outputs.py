"""What a graph is written as and checked with: the viewer JSON holds exactly the pruned nodes and edges with the
adjacency's weights, the viewer page embeds it, the frame lists every node, and the intervention check measures
the real model's change with the feature's write removed and scales the graph's prediction linearly."""

import json

import pytest
import torch
from numerics import TINY
from random_models import make_random_model
from random_transcoders import per_layer

import resid
from resid.analyses import graphs
from resid.analyses.graphs.export import graph_json
from resid.analyses.graphs.influence import threshold_of
from resid.analyses.graphs.validate import predicted_effects, validate
from resid.analyses.graphs.viewer import page

IDS = [11, 5, 7, 2, 9, 31, 3]


@pytest.fixture(scope="module")
def built():
    model = make_random_model("llama_gqa")
    transcoders = per_layer(model)
    return model, transcoders, graphs.attribute(model, IDS, transcoders)


def test_the_json_holds_the_pruned_nodes_and_their_edges(built, tmp_path) -> None:
    _, _, graph = built
    path = graphs.write_json(graph, tmp_path / "g.json", node_threshold=0.7, edge_threshold=0.95)
    data = json.loads(path.read_text())
    pruned = graph.prune(0.7, 0.95)
    ids = {}
    for index in pruned.node_mask.nonzero().flatten().tolist():
        if index < graph.n_features:
            layer, pos, feature = graph.features[index].tolist()
            ids[index] = f"{layer}_{feature}_{pos}"
        elif index < graph.n_features + graph.n_errors:
            layer, pos = divmod(index - graph.n_features, graph.n_pos)
            ids[index] = f"0_{layer}_{pos}"
        elif index < graph.n_nodes - graph.n_logits:
            pos = index - graph.n_features - graph.n_errors
            ids[index] = f"E_{IDS[pos]}_{pos}"
        else:
            ids[index] = f"{graph.n_layers + 1}_{int(graph.logit_tokens[index - graph.n_nodes + graph.n_logits])}_6"
    by_id = {v: k for k, v in ids.items()}
    links = data["links"]
    assert len(links) == int(pruned.edge_mask.sum()) > 0
    row_of = {int(node): row for row, node in enumerate(graph.row_nodes)}
    for link in links:
        target, source = by_id[link["target"]], by_id[link["source"]]
        assert pruned.edge_mask[row_of[target], source]
        assert link["weight"] == pytest.approx(float(graph.adjacency[target, source]), rel=1e-6)
    listed = {node["node_id"] for node in data["nodes"]}
    assert listed <= set(ids.values())
    assert {f"E_{t}_{p}" for p, t in enumerate(IDS)} <= listed  # tokens always stay
    assert sum(node["is_target_logit"] for node in data["nodes"]) == 1
    replacement, completeness = graph.scores()
    assert data["metadata"]["resid"]["replacement_score"] == pytest.approx(replacement)
    assert 0 < replacement < 1 and 0 < completeness < 1
    index = json.loads((tmp_path / "graph-metadata.json").read_text())
    assert [g["slug"] for g in index["graphs"]] == ["g"]


def test_the_viewer_page_embeds_the_graph(built) -> None:
    _, _, graph = built
    html = page(graph, cards={"0_3_4": "cards/x.html"})
    start = html.index("id='graph-data'>") + len("id='graph-data'>")
    embedded = json.loads(html[start:html.index("</script>", start)].replace("<\\/", "</"))
    assert embedded["links"] == graph_json(graph, graph.model_name)["links"]
    assert "cards/x.html" in html and "<svg id='graph'" in html


def test_links_carry_their_influence_share_which_the_edge_threshold_cut(built) -> None:
    """Each link's `influence` is its share of the edges' influence score: every kept one at or above the score the
    edge threshold cuts at (the viewer's edge slider ranks by it), and the shares of all edges sum to 1."""
    _, _, graph = built
    pruned = graph.prune(0.8, 0.9)
    links = graph_json(graph, edge_threshold=0.9)["links"]
    cut = threshold_of(pruned.edge_scores, 0.9)
    assert links and min(link["influence"] for link in links) >= float(cut) * (1 - 1e-6)
    assert float(pruned.edge_scores.sum()) == pytest.approx(1.0, rel=1e-5)
    assert len(links) < int((pruned.edge_scores > 0).sum()), "the threshold cut some edges"


def test_supernodes_are_written_as_qparams_and_unknown_ids_refused(built, tmp_path) -> None:
    """Named groups of the pruned graph's nodes become qParams.supernodes ([name, id, ...], Neuronpedia's form) in
    the JSON and in the page; an id the pruned graph does not have is refused with what to do."""
    _, _, graph = built
    ids = [n["node_id"] for n in graph_json(graph)["nodes"] if n["feature_type"] == "cross layer transcoder"]
    groups = [("early", ids[:2]), ("late", ids[-1:])]
    data = json.loads(graphs.write_json(graph, tmp_path / "g.json", supernodes=groups).read_text())
    assert data["qParams"]["supernodes"] == [["early", *ids[:2]], ["late", ids[-1]]]
    html = page(graph, supernodes=groups)
    start = html.index("id='graph-data'>") + len("id='graph-data'>")
    assert json.loads(html[start:html.index("</script>", start)])["qParams"]["supernodes"][0] == ["early", *ids[:2]]
    with pytest.raises(resid.ResidError, match=r"'31_0_2'\] are not in the graph pruned .* raise the thresholds"):
        graph_json(graph, supernodes=[("x", [ids[0], "31_0_2"])])


def test_the_frame_lists_every_node_with_its_site(built) -> None:
    _, _, graph = built
    frame = graph.to_frame()
    assert len(frame) == graph.n_nodes
    assert frame["kind"].value_counts().to_dict() == {"feature": graph.n_features, "error": graph.n_errors,
                                                      "token": graph.n_pos, "logit": graph.n_logits}
    first = frame.iloc[0]
    layer, pos, feature = graph.features[0].tolist()
    assert resid.Site.parse(first["site"]) == resid.Site(layer, "mlp", feature=feature, positions=(pos,))
    # every node has a Site, its label parses back to it, and no two nodes share one
    sites = graph.sites()
    assert [resid.Site.parse(label) for label in frame["site"]] == sites and len(set(sites)) == graph.n_nodes
    logit = frame[frame["kind"] == "logit"].iloc[0]
    assert resid.Site.parse(logit["site"]) == resid.Site(None, "logits", token=int(graph.logit_tokens[0]),
                                                          positions=(graph.n_pos - 1,))
    edges = graph.edges()
    assert len(edges) == int((graph.adjacency != 0).sum())
    # a feature or error node names the prompt's token at its position; node_id is the JSON's id
    assert first["token"] == int(graph.token_ids[pos]) and first["token_str"] == graph.token_strs[pos]
    assert first["node_id"] == f"{layer}_{feature}_{pos}" and logit["token_str"] == graph.logit_strs[0]
    data = graph_json(graph, node_threshold=1.0, edge_threshold=1.0)
    at = set(zip(frame["node_id"], frame["position"], strict=True))
    assert all((node["node_id"], node["ctx_idx"]) in at for node in data["nodes"])


def test_supernodes_take_the_frames_node_indices_as_well_as_ids(built) -> None:
    _, _, graph = built
    frame = graph.to_frame()
    data = graph_json(graph, node_threshold=1.0, edge_threshold=1.0)
    kept = {node["node_id"] for node in data["nodes"]}
    rows = frame[frame["node_id"].isin(kept) & (frame["kind"] == "feature")].head(2)
    by_index = graph_json(graph, node_threshold=1.0, edge_threshold=1.0,
                          supernodes=[("pair", [int(i) for i in rows["node"]])])
    assert by_index["qParams"]["supernodes"] == [["pair", *rows["node_id"]]]


def test_validation_measures_the_real_model_without_the_features_write(built) -> None:
    model, transcoders, graph = built
    report = validate(model, graph, transcoders, top=3)
    clean = model.run(torch.tensor([IDS])).logits[0, -1]
    for row in report["features"]:
        layer, pos, feature, a = row["layer"], row["position"], row["feature"], row["activation"]
        write = a * transcoders[layer].W_dec[feature].detach()

        def remove(value, tokens, write=write, pos=pos):
            value = value.clone()
            value[:, pos] -= write
            return value

        logits = model.run(torch.tensor([IDS]), interventions=[resid.Hook(resid.Site(layer, "mlp"), remove)]).logits
        change = (logits[0, -1] - logits[0, -1].mean()) - (clean - clean.mean())
        torch.testing.assert_close(torch.tensor(row["measured"]), change[graph.logit_tokens], **TINY)
    nodes = [row["node"] for row in report["features"]]
    doubled = validate(model, graph, transcoders, top=3, factor=2.0)
    torch.testing.assert_close(torch.tensor([r["predicted"] for r in doubled["features"]]),
                               -torch.tensor([r["predicted"] for r in report["features"]]))
    # a feature of the last layer reaches the logits directly only: its prediction is its edge
    last = [i for i in range(graph.n_features) if graph.features[i, 0] == graph.n_layers - 1]
    direct = graph.adjacency[graph.n_nodes - graph.n_logits:, last].T
    torch.testing.assert_close(predicted_effects(graph, last), direct, **TINY)
    assert nodes == torch.argsort(graph.influence()[:graph.n_features], descending=True)[:3].tolist()
