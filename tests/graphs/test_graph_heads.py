"""A graph's edges split by the head of their last attention hop (resid.analyses.graphs.heads): the parts of every
edge sum to it on every family (per-layer and cross-layer transcoders); each part equals the frozen model run
FORWARD from the source's write alone with only some heads' patterns kept (no backward sweep involved); the
residual part of an edge between two positions is zero; the split reaches the viewer's JSON, the page and the
command line; bad input is refused in one message that says what to do."""

import json
from pathlib import Path

import pytest
import torch
from numerics import TINY
from random_models import make_random_model
from random_transcoders import cross_layer, per_layer
from tiny_models import build

import resid
import resid.dictionaries
from resid.analyses import Execution, graphs
from resid.analyses.cli import graph as graph_cli
from resid.analyses.cli.main import main
from resid.analyses.graphs import export, viewer
from resid.analyses.graphs import heads as heads_module
from resid.analyses.graphs.frozen import Frozen
from resid.analyses.graphs.qk import QK
from resid.analyses.graphs.replacement import replace
from resid.analyses.io import tables

IDS = [11, 5, 7, 2, 9, 31, 3]


def _split(model, transcoders, **options) -> tuple[graphs.Graph, graphs.HeadSplit]:
    graph = graphs.attribute(model, IDS, transcoders)
    return graph, graphs.split_heads(model, graph, transcoders, **options)


def _assert_parts_sum_to_every_edge(graph: graphs.Graph, split: graphs.HeadSplit) -> None:
    row, source = (graph.rows != 0).nonzero(as_tuple=True)
    assert split.n_edges == len(row) > 100
    weights = graph.rows[row, source]
    # edges in the split's order: (source, target) -> the graph's weight
    expected = dict(zip(zip(source.tolist(), graph.row_nodes[row].tolist(), strict=True), weights.tolist(),
                        strict=True))
    got = torch.tensor([expected[pair] for pair in zip(split.sources.tolist(), split.targets.tolist(), strict=True)])
    torch.testing.assert_close(split.weights, got, **TINY)
    positions = torch.tensor([site.positions[0] for site in split.sites])
    across = positions[split.sources] != positions[split.targets]
    assert bool(across.any()) and not bool(split.parts[across, 0].any())  # only attention moves across positions
    assert bool(split.parts[~across, 0].any()) and bool(split.parts[:, 1:].any())


def test_the_parts_of_every_edge_sum_to_it(random_model) -> None:
    """Every family (pre-norm, GPT-2 biases, parallel, Gemma gains, sandwich norms with soft caps and q/k norms and
    GQA, post-norms only), per-layer transcoders with a skip path on layer 1."""
    _assert_parts_sum_to_every_edge(*_split(random_model, per_layer(random_model)))


def test_the_parts_of_every_edge_of_a_deepseek_model_sum_to_it() -> None:
    """Latent attention: each head's part reads the shared latent through that head's W_UV."""
    from moe_models import make_deepseek_model
    model = make_deepseek_model()
    _assert_parts_sum_to_every_edge(*_split(model, per_layer(model)))


@pytest.mark.parametrize("kind", ["llama_gqa", "neox_parallel", "gemma3_like"])
def test_the_parts_sum_to_every_edge_of_a_cross_layer_transcoder_graph(kind) -> None:
    model = make_random_model(kind)
    _assert_parts_sum_to_every_edge(*_split(model, cross_layer(model)))


# --- the forward oracle ---------------------------------------------------------------------------------------------
@torch.no_grad()
def _forward(model, rep, graph: graphs.Graph, source: int, target: int, kept: list[set[int] | None]) -> float:
    """The target's read-out of the frozen model (constants off) run forward from the write of node `source` alone,
    layer l's pattern keeping the heads kept[l] (None: all of them) and zero for the others."""
    n_f, n_e, n_pos, n_layers = graph.n_features, graph.n_errors, graph.n_pos, graph.n_layers
    found = rep.transcoders
    values = dict(rep.frozen.values)
    for layer, heads in enumerate(kept):
        site = resid.Site(layer, "attn", field="pattern")
        if heads is not None:
            mask = torch.zeros(model.config.n_heads, 1, 1)
            mask[sorted(heads)] = 1
            values[site] = values[site] * mask
    frozen = Frozen(values, rep.frozen.final_scale)
    d_model = model.config.d_model
    writes = torch.zeros(n_layers, n_pos, d_model)  # into each layer's MLP write
    resid_0 = torch.zeros(n_pos, d_model)
    if source < n_f:
        layer, position, feature = graph.features[source].tolist()
        for into in found.targets(layer):
            writes[into, position] = graph.activations[source] * found.decoder(layer, into, torch.tensor([feature]))[0]
    elif source < n_f + n_e:
        layer, position = divmod(source - n_f, n_pos)
        writes[layer, position] = rep.errors[layer, position]
    else:
        resid_0[source - n_f - n_e] = rep.embed[source - n_f - n_e]
    reads = {}

    def mlp(layer):
        def write(read):
            reads[layer] = read
            skip = found.skip(layer)
            x = rep.transcoder_input(layer, read, frozen, constants=False)
            return writes[layer] + (x @ skip if skip is not None else 0)
        return write

    x = resid_0
    for layer, block in enumerate(model.blocks):
        x = block.frozen(x, frozen.values, mlp(layer), constants=False)
    if target < n_f:
        layer, position, feature = graph.features[target].tolist()
        read = rep.transcoder_input(layer, reads[layer], frozen, constants=False)[position]
        return float(read @ found.encoder(layer, torch.tensor([feature]))[0])
    token = int(graph.logit_tokens[target - (graph.n_nodes - graph.n_logits)])
    normalized = model.readout.frozen(x, frozen.final_scale, constants=False)[-1]
    w_u = model.readout.unembedding(through_norm=False)
    return float(normalized @ (w_u[:, token] - w_u.mean(1)))


def _oracle(model, rep, graph, source: int, target: int) -> torch.Tensor:
    """[1 + n_layers * n_heads]: the residual part (every pattern zero), then head h of layer l's part: the
    forward with the patterns below l as in the run, head h alone at l and none above, minus the same with no head
    at l (which leaves the paths whose last hop is below l, and those that cross none)."""
    n_layers, n_heads = graph.n_layers, model.config.n_heads
    parts = [_forward(model, rep, graph, source, target, [set()] * n_layers)]
    for layer in range(n_layers):
        below, above = [None] * layer, [set()] * (n_layers - layer - 1)
        without = _forward(model, rep, graph, source, target, [*below, set(), *above])
        parts += [_forward(model, rep, graph, source, target, [*below, {h}, *above]) - without
                  for h in range(n_heads)]
    return torch.tensor(parts)


def _chosen_edges(graph: graphs.Graph) -> list[tuple[int, int]]:
    """The strongest edge of each kind: token -> logit from an earlier position and from the last one, layer-0
    feature -> logit, error -> logit, token -> top-layer feature, layer-0 feature -> top-layer feature."""
    n_f, n_e = graph.n_features, graph.n_errors
    logit, top = graph.n_nodes - graph.n_logits, graph.features[:, 0] == graph.n_layers - 1
    tokens = range(n_f + n_e, n_f + n_e + graph.n_pos)
    first_layer = (graph.features[:, 0] == 0).nonzero().flatten().tolist()
    errors = range(n_f, n_f + n_e)
    adjacency = graph.adjacency
    chosen = []
    for sources, targets in ((list(tokens)[:-1], [logit]), ([tokens[-1]], [logit]), (first_layer, [logit]),
                             (list(errors), [logit]), (list(tokens), top.nonzero().flatten().tolist()),
                             (first_layer, top.nonzero().flatten().tolist())):
        block = adjacency[targets][:, sources].abs()
        t, s = divmod(int(block.argmax()), len(sources))
        assert block.max() > 0
        chosen.append((sources[s], targets[t]))
    return chosen


@pytest.mark.parametrize("kind, transcoder", [("llama_gqa", "per_layer"), ("neox_parallel", "per_layer"),
                                              ("gemma3_like", "per_layer"), ("neox_parallel", "cross_layer")])
def test_each_part_is_the_forward_through_that_head_alone(kind, transcoder) -> None:
    """Per-layer transcoders have a skip path on layer 1: in a sequential block it reads resid_mid, so it carries
    the layer's head writes up (their paths end at that head); in a parallel one it reads resid_pre beside them."""
    model = make_random_model(kind)
    transcoders = per_layer(model) if transcoder == "per_layer" else cross_layer(model)
    graph = graphs.attribute(model, IDS, transcoders)
    rep = replace(model, IDS, transcoders)
    chosen = _chosen_edges(graph)
    split = graphs.split_heads(model, graph, transcoders, edges=chosen)
    assert [(int(s), int(t)) for s, t in zip(split.sources, split.targets, strict=True)] == chosen
    for (source, target), parts in zip(chosen, split.parts, strict=True):
        expected = _oracle(model, rep, graph, source, target)
        torch.testing.assert_close(parts, expected, **TINY)
        torch.testing.assert_close(parts.sum(), graph.adjacency[target, source], **TINY)
    assert int(split.parts[:, 1:].any(1).sum()) >= 4  # heads carry most of them: the comparison is not of zeros


# --- tables, JSON, page, command line --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def built():
    model = make_random_model("llama_gqa")
    transcoders = per_layer(model)
    graph = graphs.attribute(model, IDS, transcoders)
    pruned = graph.pruned(0.8, 0.98)
    return model, transcoders, graph, pruned, graphs.split_heads(model, pruned, transcoders)


def test_an_edge_is_looked_up_by_index_site_or_label(built) -> None:
    _, _, _, pruned, split = built
    edges = pruned.edges()
    strongest = edges.iloc[int(edges["weight"].abs().argmax())]
    source, target = int(strongest["source"]), int(strongest["target"])
    sites = pruned.sites()
    by_index = split.of(source, target)
    assert by_index.equals(split.of(sites[source], sites[target]))
    assert by_index.equals(split.of(sites[source].label, sites[target].label))
    assert by_index["weight"].sum() == pytest.approx(float(strongest["weight"]), rel=1e-4)
    position = sites[target].positions[0]
    for via in by_index["via"]:
        assert via == "residual" or (resid.Site.parse(via).part == "attn" and resid.Site.parse(via).positions
                                     == (position,) and resid.Site.parse(via).head is not None)
    frame = split.to_frame()
    assert list(frame.columns) == ["source", "target", "source_site", "target_site", "via", "weight"]
    assert len(frame) == int((split.parts != 0).sum()) and not bool((frame["weight"] == 0).any())
    sums = frame.groupby(["source", "target"])["weight"].sum()
    torch.testing.assert_close(torch.tensor(sums[(source, target)]), torch.tensor(strongest["weight"]), **TINY)
    assert set(zip(frame["source"], frame["target"], strict=True)) == set(
        zip(edges["source"], edges["target"], strict=True))


def test_the_json_and_the_page_carry_each_links_heads(built, tmp_path) -> None:
    model, transcoders, graph, _, split = built
    path = graphs.write_json(graph, tmp_path / "g.json", heads=split)
    links = json.loads(path.read_text())["links"]
    assert links and all("heads" in link for link in links)  # the pruned graph's split covers every link
    for link in links:  # the LINK_HEADS largest parts, then the rest summed: they add up to the link
        parts = list(link["heads"].values())
        rest = link.get("heads_rest", [0, 0.0])
        assert sum(parts) + rest[1] == pytest.approx(link["weight"], rel=1e-4, abs=1e-6)
        assert [abs(p) for p in parts] == sorted((abs(p) for p in parts), reverse=True)
        assert len(parts) <= export.LINK_HEADS and (rest[0] == 0 or len(parts) == export.LINK_HEADS)
        assert all(abs(p) >= abs(rest[1]) / max(rest[0], 1) - 1e-9 for p in parts[-1:])  # kept are the largest
    assert any("heads_rest" in link for link in links)
    plain = json.loads(graphs.write_json(graph, tmp_path / "plain.json").read_text())["links"]
    assert [{k: v for k, v in link.items() if k not in ("heads", "heads_rest")} for link in links] == plain
    # the parts written are the split's own, read as float32 exactly
    frame = split.to_frame()
    strongest = max(links, key=lambda link: len(link["heads"]))
    site_of = {node["node_id"]: node for node in json.loads(path.read_text())["nodes"]}
    assert site_of[strongest["target"]]["ctx_idx"] == resid.Site.parse(next(iter(
        v for v in strongest["heads"] if v != "residual"))).positions[0]
    assert set(frame["via"]) >= set(strongest["heads"])
    parts = set(frame["weight"])  # float32 values
    assert all(float(torch.tensor(w, dtype=torch.float32)) in parts for w in strongest["heads"].values())
    # the page embeds the same links, and with QK summaries of the carrying heads, why they attended
    triples = split.carriers(per_edge=2, limit=5)
    assert len(triples) == 5 and all(site.part == "attn" and site.head is not None for site, _ in triples)
    summaries = QK(model, graph.token_ids, transcoders).summaries(triples, top=3)
    html = viewer.page(graph, heads=split, qk=summaries)
    start = html.index("id='graph-data'>") + len("id='graph-data'>")
    embedded = json.loads(html[start:html.index("</script>", start)].replace("<\\/", "</"))
    assert embedded["links"] == links and embedded["qk"] == summaries
    assert "function showEdge" in html and "function showQK" in html and "Click a node or an edge." in html
    with_qk = json.loads(graphs.write_json(graph, tmp_path / "qk.json", heads=split, qk=summaries).read_text())
    assert with_qk["qk"] == summaries


def test_resid_graph_heads_writes_the_split_beside_the_json(tmp_path, capsys) -> None:
    folder = tmp_path / "model"
    build("llama", folder)
    data = Path(__file__).resolve().parents[1] / "data" / "dictionaries"
    out = tmp_path / "g.json"
    prompt = "The cat sat on the mat because"
    assert main(["graph", prompt, "--model", str(folder), "--transcoders", str(data / "circuit_tracer" / "plt"),
                 "--out", str(out), "--heads"]) == 0
    assert "head split:" in capsys.readouterr().out
    model = resid.load(folder)
    transcoders = resid.dictionaries.load(data / "circuit_tracer" / "plt", model)
    pruned = graphs.attribute(model, prompt, transcoders).pruned()
    expected = graphs.split_heads(model, pruned, transcoders).to_frame()
    written = tables.read(tmp_path / "g-heads.csv")
    assert list(written["via"]) == list(expected["via"]) and len(written) > 0
    torch.testing.assert_close(torch.tensor(written["weight"].to_numpy()), torch.tensor(expected["weight"].to_numpy()),
                               **TINY)
    written_json = json.loads(out.read_text())
    links = written_json["links"]
    assert all("heads" in link for link in links) and "showEdge" in (tmp_path / "g.html").read_text()
    # QK attribution of the heads carrying the edges, as QK.summaries computes it
    split = graphs.split_heads(model, pruned, transcoders)
    carriers = split.carriers(graph_cli.QK_PER_EDGE, graph_cli.QK_LIMIT)
    assert list(written_json["qk"]) == [f"{site.label}->{key}" for site, key in carriers]
    name, entry = next(iter(written_json["qk"].items()))
    site, key = carriers[0]
    result = QK(model, prompt, transcoders).score(site, key=key)  # the carrier's head Site, at its query
    assert entry["raw"] == pytest.approx(result.raw, rel=1e-4, abs=1e-5) and "function showQK" in \
        (tmp_path / "g.html").read_text()
    assert main(["graph", prompt, "--model", str(folder), "--transcoders", str(data / "circuit_tracer" / "plt"),
                 "--heads"]) == 2
    err = capsys.readouterr().err
    assert "--heads writes the head split beside the graph's JSON: give --out" in err and err.count("\n") == 1


@pytest.mark.parametrize("case, message", [
    (lambda split, built: split.of(10**6, 0), r"The source node 1000000 is out of range: the graph has \d+ nodes"),
    (lambda split, built: split.of("layers[0].mlp.feature[999]@0", 0),
     r"The source layers\[0\]\.mlp\.feature\[999\]@0 is no node of this graph: give one of graph.sites\(\)"),
    (lambda split, built: split.of(2.5, 0), r"The source 2.5 is no graph node: give its index"),
    (lambda split, built: split.of(built[3].n_nodes - 1, 0),
     r"-> .* is not an edge of this head split .*: list them with split.to_frame\(\)"),
    (lambda split, built: graphs.split_heads(make_random_model("llama_gqa", seed=1), built[3], built[1]),
     r"The graph's feature node layers\[\d\]\.mlp\.feature\[\d+\]@\d .* is not what random-llama_gqa with these "
     r"transcoders finds on the graph's prompt: the graph was built by another model or other transcoders"),
    (lambda split, built: graphs.split_heads(make_random_model("gpt2_like"), built[3], built[1]),
     r"The graph was built with random-llama_gqa \(3 layers\), not random-gpt2_like"),
    (lambda split, built: graphs.split_heads(built[0], built[3], per_layer(built[0], seed=5)),
     r"The graph's feature node .* the graph was built by another model or other transcoders"),
    (lambda split, built: graphs.split_heads(built[0], built[3], built[1], edges=[(0, built[3].n_nodes - 1, 2)]),
     r"edges lists \(source, target\) pairs of graph nodes"),
    (lambda split, built: graphs.split_heads(built[0], built[3], built[1], edges=[(built[3].n_nodes - 1, 0)]),
     r"is no edge of this graph \(its weight is zero, or pruning removed it\): pass edges the graph has"),
    (lambda split, built: graphs.split_heads(built[0], built[2], built[1],
                                             execution=Execution(out="x.parquet")),
     r"A head split is built in this process and returned: .*executor, workers and progress; drop out\."),
])
def test_bad_input_is_refused_with_what_to_do(built, case, message) -> None:
    with pytest.raises(resid.ResidError, match=message):
        case(built[4], built)


def test_a_split_too_large_is_refused_with_what_to_do(built, monkeypatch) -> None:
    model, transcoders, graph, _, _ = built
    monkeypatch.setattr(heads_module, "MAX_PARTS", 1000)
    with pytest.raises(resid.ResidError, match=r"would hold \d+ floats \(at most 1000, .*\): split a graph "
                                               r"pruned harder \(graph.pruned\(\) with lower node and edge "
                                               r"thresholds\) or pass edges=\[\(source, target\), \.\.\.\]"):
        graphs.split_heads(model, graph, transcoders)
    other = make_random_model("llama_gqa")
    with pytest.raises(resid.ResidError, match="The head split is of another graph"):
        graphs.write_json(graphs.attribute(other, IDS[:5], transcoders), "unused.json", heads=built[4])


def test_carriers_are_the_largest_head_parts_each_head_and_key_once(built) -> None:
    """What QK attribution is asked about: the head parts of largest |weight| (the residual aside), as (the head at
    the edge's target position, the edge's source position), without repeats."""
    _, _, _, pruned, split = built
    frame = split.to_frame()
    heads = frame[frame["via"] != "residual"].copy()
    heads["key"] = [pruned.sites()[s].positions[0] for s in heads["source"]]
    found = split.carriers(per_edge=int(heads.groupby(["source", "target"]).size().max()), limit=10**6)
    assert len(found) == len(set(found)) == len(set(zip(heads["via"], heads["key"], strict=True)))
    best = heads.loc[heads["weight"].abs().idxmax()]
    assert (found[0][0].label, found[0][1]) == (best["via"], best["key"])
    assert len(split.carriers(per_edge=1, limit=4)) == 4
