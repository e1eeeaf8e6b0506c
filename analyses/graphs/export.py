"""A graph as the JSON file circuit-tracer's frontend and Neuronpedia's graph viewer read (a pruned graph: the nodes
and edges `Graph.prune` keeps), and the index file their local server lists graphs from.

    {"metadata": {slug, scan, transcoder_list, prompt_tokens, prompt, node_threshold, ...},
     "qParams": {pinnedIds, supernodes, linkType, clickedId, sg_pos},
     "nodes": [{node_id, feature, layer, ctx_idx, feature_type, token_prob, is_target_logit, run_idx,
                reverse_ctx_idx, jsNodeId, clerp, influence, activation}, ...],
     "links": [{source, target, weight, influence, heads}, ...]}

Node ids (circuit-tracer 0.5.0's): a feature "L_F_P" (its `feature` field Cantor's pairing of L and F), an error
"0_L_P", a token "E_T_P" (T its token id), a logit "(n_layers + 1)_T_P" at the last position. (A layer-0 feature F
at P and layer F's error at P share an id in this format; the matrix and the frame keep them apart.) `influence`
is a node's place in the influence ranking (the cumulative share of influence up to it); feature nodes carry their
activation; a link's `influence` is its share of the edges' total influence score, the ranking Graph.prune's edge
threshold cuts. The first logit is the target logit. Only nodes with a kept edge stay,
tokens and logits always. resid adds its own keys under metadata["resid"] (scores, the model, timings) and, given
a head split (resid.analyses.graphs.heads), a "heads" key to each link it splits: {via: weight}, the edge's
LINK_HEADS largest non-zero parts by the head of its last attention hop ("layers[3].attn.head[5]@7", or "residual"),
largest |weight| first, and "heads_rest": [how many more, their sum], so the parts written sum to the link's weight
(circuit-tracer's and Neuronpedia's viewers ignore keys they do not know; the split's own table,
HeadSplit.to_frame, keeps every part: about 90 per link on a pruned SmolLM2 graph). Given QK summaries
(resid.analyses.graphs.qk.QK.summaries), a top-level "qk" key: why each head carrying a link attended from the
link's target position to its source position, keyed "<head site>-><key position>".
"""

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
import torch

from resid.analyses.graphs.graph import Graph
from resid.analyses.graphs.heads import HeadSplit
from resid.analyses.io import atomic
from resid.errors import ResidError

LINK_HEADS = 12  # parts of a link the JSON keeps, largest first (the split's table keeps them all)


def _cantor(x: int, y: int) -> int:
    """The feature field of a feature node: a unique integer of (layer, feature), Cantor's pairing."""
    return (x + y) * (x + y + 1) // 2 + y


def _token(text: str) -> str:
    return text.replace("\n", "⏎").replace("\t", "→").replace("\r", "↵")


# (name, node ids or node indices, as Graph.to_frame's node_id / node): Neuronpedia's qParams.supernodes
Supernodes = Sequence[tuple[str, Sequence[str | int]]]


def graph_json(graph: Graph, slug: str = "graph", node_threshold: float = 0.8, edge_threshold: float = 0.98,
               decode=None, heads: HeadSplit | None = None, qk: dict | None = None,
               supernodes: Supernodes = (), labels: Mapping[str, str] | None = None, circuit=None,
               measured: pd.DataFrame | None = None) -> dict:
    """The viewer's JSON object of `graph` pruned at the thresholds. `decode(id) -> str` names the logit tokens
    (default: the graph's own token strings for prompt tokens, the id otherwise). `heads`: a split of this graph's
    edges (split_heads of graph.pruned() at the same thresholds covers every link), its parts put on the links.
    `supernodes`: named groups of the pruned graph's node ids, written as qParams.supernodes ([name, id, ...]),
    which the viewer draws and Neuronpedia reads. `labels`: {"L_F": label} (graphs.labels.by_key), each feature
    node's `clerp`. `circuit` (graphs.circuit of this graph): its supernodes (unless `supernodes` are given) and its
    features as qParams.pinnedIds, its scores and reasons under metadata.resid.circuit, with `measured`
    (graphs.measure's table) there too."""
    if circuit is not None:
        if circuit.graph is not graph:
            raise ResidError("The circuit is of another graph than the one written: pass the graph it was made from "
                             "(circuit.graph).")
        supernodes = supernodes or circuit.groups()
        labels = {**circuit.labels, **(labels or {})}
    pruned = graph.prune(node_threshold, edge_threshold)
    scores = pruned.cumulative_scores
    n_f, n_e, n_p, layers = graph.n_features, graph.n_errors, graph.n_pos, graph.n_layers
    decode = decode or (lambda i: str(i))
    ids = graph.node_ids()
    nodes: dict[int, dict] = {}
    for index in pruned.node_mask.nonzero().flatten().tolist():
        influence = float(scores[index])
        if index < n_f:
            layer, pos, feature = graph.features[index].tolist()
            nodes[index] = _node(ids[index], _cantor(layer, feature), str(layer), pos,
                                 "cross layer transcoder", f"{layer}_{feature}-0", influence=influence,
                                 activation=float(graph.activations[index]),
                                 clerp=(labels or {}).get(f"{layer}_{feature}", ""))
        elif index < n_f + n_e:
            layer, pos = divmod(index - n_f, n_p)
            nodes[index] = _node(ids[index], -1, str(layer), pos, "mlp reconstruction error",
                                 f"{layer}_{pos}-0", influence=influence)
        elif index < n_f + n_e + n_p:
            pos = index - n_f - n_e
            token = int(graph.token_ids[pos])
            nodes[index] = _node(ids[index], pos, "E", pos, "embedding", f"E_{token}-{pos}",
                                 influence=influence)
        else:
            k = index - n_f - n_e - n_p
            token, prob = int(graph.logit_tokens[k]), float(graph.logit_probabilities[k])
            layer = str(layers + 1)
            nodes[index] = _node(ids[index], token, layer, n_p - 1, "logit", f"L_{token}-{n_p - 1}",
                                 token_prob=prob, is_target_logit=k == 0,
                                 clerp=f'Output "{_token(decode(token))}" (p={prob:.3f})')
    kept_rows, sources = pruned.edge_mask.nonzero(as_tuple=True)
    weights = graph.rows[kept_rows, sources].tolist()
    shares = pruned.edge_scores[kept_rows, sources].tolist()
    targets = graph.row_nodes[kept_rows]
    links = [{"source": nodes[s]["node_id"], "target": nodes[t]["node_id"], "weight": w, "influence": share}
             for s, t, w, share in zip(sources.tolist(), targets.tolist(), weights, shares, strict=True)
             if s in nodes and t in nodes]
    if heads is not None:
        _add_heads(graph, heads, links, [(s, t) for s, t in zip(sources.tolist(), targets.tolist(), strict=True)
                                         if s in nodes and t in nodes])
    connected = {link["source"] for link in links} | {link["target"] for link in links}
    used = [n for n in nodes.values() if n["node_id"] in connected or n["feature_type"] in ("embedding", "logit")]
    replacement, completeness = graph.scores()
    metadata = {
        "slug": slug, "scan": graph.transcoders, "transcoder_list": [], "node_threshold": node_threshold,
        "prompt_tokens": [_token(t) for t in graph.token_strs], "prompt": "".join(graph.token_strs),
        "schema_version": 1,
        "resid": {"model": graph.model_name, "edge_threshold": edge_threshold, "skip_bos": graph.skip_bos,
                  "replacement_score": replacement,
                  "completeness_score": completeness, "n_active_features": len(graph.active_features),
                  **{k: v for k, v in graph.metadata.items() if isinstance(v, (int, float, str, bool, type(None)))}},
    }
    if "validation" in graph.metadata:
        metadata["resid"]["validation"] = graph.metadata["validation"]
    if circuit is not None:
        metadata["resid"]["circuit"] = {**circuit.summary(), **_measured(measured)}
    pinned = [] if circuit is None else [i for i in circuit.node_ids() if i in {n["node_id"] for n in used}]
    qparams = {"pinnedIds": pinned, "supernodes": _supernodes(supernodes, {n["node_id"] for n in used}, ids,
                                                          node_threshold, edge_threshold),
               "linkType": "both", "clickedId": "", "sg_pos": ""}
    data = {"metadata": metadata, "qParams": qparams, "nodes": used, "links": links}
    if qk:
        data["qk"] = qk
    return data


def _measured(measured: pd.DataFrame | None) -> dict:
    """graphs.measure's table as plain values: its rows, necessity and sufficiency."""
    if measured is None:
        return {}
    return {"necessity": measured.attrs.get("necessity"), "sufficiency": measured.attrs.get("sufficiency"),
            "interventions": measured.to_dict(orient="records")}


def _supernodes(groups: Supernodes, kept: set[str], all_ids: list[str], node_threshold: float,
                edge_threshold: float) -> list[list[str]]:
    """qParams.supernodes of `groups`, every id one of the pruned graph's nodes (`kept`): an id string, or a node's
    index in the graph (Graph.to_frame's `node`; `all_ids` turns it into its id)."""
    out = []
    for name, given in groups:
        ids = [all_ids[i] if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(all_ids) else i
               for i in given]
        missing = [i for i in ids if i not in kept]
        if missing or not ids or not str(name).strip():
            what = (f"its nodes {missing[:5]} are not in the graph pruned at node threshold {node_threshold} and edge "
                    f"threshold {edge_threshold}" if missing else "it needs a name and at least one node id")
            raise ResidError(f"Supernode {name!r}: {what}. Give a name and node ids of the pruned graph (graph_json's "
                             f"nodes: a feature is 'L_F_P'), or raise the thresholds so that the nodes stay.")
        out.append([str(name), *ids])
    return out


def write_json(graph: Graph, path: str | Path, slug: str | None = None, node_threshold: float = 0.8,
               edge_threshold: float = 0.98, decode=None, heads: HeadSplit | None = None,
               qk: dict | None = None, supernodes: Supernodes = (), labels: Mapping[str, str] | None = None,
               circuit=None, measured: pd.DataFrame | None = None) -> Path:
    """Write the viewer's JSON file of the pruned graph to `path` (a .json file) and list it in graph-metadata.json
    beside it, the index circuit-tracer's local server reads; returns the path. `decode(id) -> str` names the logit
    tokens (default: the graph's own strings of its logit tokens). `heads` (graphs.split_heads of graph.pruned() at
    the same thresholds): each link's parts by head, under its "heads" key; `qk` (QK.summaries of the heads that
    carry the links, e.g. of split.carriers()): why they attended, under a top-level "qk" key; `supernodes`: named
    groups of node ids (qParams.supernodes); `labels`, `circuit`, `measured`: as graph_json."""
    path = Path(path)
    if decode is None:
        strs = dict(zip(graph.logit_tokens.tolist(), graph.logit_strs, strict=True))
        decode = lambda i: strs.get(i, str(i))  # noqa: E731
    slug = slug or path.stem
    data = graph_json(graph, slug, node_threshold, edge_threshold, decode, heads, qk, supernodes, labels, circuit,
                      measured)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write(path, json.dumps(data, indent=1))
    index = path.parent / "graph-metadata.json"
    listed = json.loads(index.read_text()) if index.exists() else {"graphs": []}
    entry = {k: v for k, v in data["metadata"].items() if k != "resid"}
    listed["graphs"] = [g for g in listed.get("graphs", []) if g.get("slug") != slug] + [entry]
    atomic.write(index, json.dumps(listed, indent=1))
    return path


def _add_heads(graph: Graph, heads: HeadSplit, links: list[dict], edges: list[tuple[int, int]]) -> None:
    """Each link's "heads": its parts in `heads`, matched by the Sites of its nodes (a split of the pruned graph
    numbers its nodes otherwise); links the split lacks get none."""
    if heads.model_name != graph.model_name or not torch.equal(heads.token_ids, graph.token_ids):
        raise ResidError(f"The head split is of another graph ({heads.model_name}, {len(heads.token_ids)} tokens) than "
                         f"the one written ({graph.model_name}, {graph.n_pos} tokens): split this graph, pruned at "
                         "the thresholds it is written with (graphs.split_heads(model, graph.pruned(...), ...)).")
    sites = graph.sites()
    edge_of = {(heads.sites[a].label, heads.sites[b].label): e
               for e, (a, b) in enumerate(zip(heads.sources.tolist(), heads.targets.tolist(), strict=True))}
    found = [edge_of.get((sites[s].label, sites[t].label)) for s, t in edges]
    rows = torch.tensor([e for e in found if e is not None], dtype=torch.long)
    if not len(rows):
        return
    parts = heads.parts[rows]  # [links e_parts]: the largest LINK_HEADS of each, the rest summed, all at once
    k = min(LINK_HEADS, parts.shape[1])
    columns = parts.abs().topk(k, dim=1).indices
    kept = parts.gather(1, columns)
    counts = (parts != 0).sum(1)
    rest = parts.sum(1) - kept.sum(1)
    kept_rows = iter(zip(columns.tolist(), kept.tolist(), counts.tolist(), rest.tolist(), strict=True))
    for link, (s, t), edge in zip(links, edges, found, strict=True):
        if edge is None:
            continue
        cols, values, count, rest_sum = next(kept_rows)
        position = sites[t].positions[0]
        # 9 significant digits: every float32 part exactly, in about half the characters of a float64
        link["heads"] = {heads.via(c, position): float(f"{w:.9g}") for c, w in zip(cols, values, strict=True)
                         if w != 0}
        if count > len(link["heads"]):  # the rest summed: the parts written still add up to the link's weight
            link["heads_rest"] = [count - len(link["heads"]), float(f"{rest_sum:.9g}")]


def _node(node_id: str, feature: int, layer: str, ctx_idx: int, feature_type: str, js_id: str, *,
          influence: float | None = None, activation: float | None = None, token_prob: float = 0.0,
          is_target_logit: bool = False, clerp: str = "") -> dict:
    return {"node_id": node_id, "feature": feature, "layer": layer, "ctx_idx": ctx_idx, "feature_type": feature_type,
            "token_prob": token_prob, "is_target_logit": is_target_logit, "run_idx": 0, "reverse_ctx_idx": 0,
            "jsNodeId": js_id, "clerp": clerp, "influence": influence, "activation": activation}


def read_json(path: str | Path) -> Graph:
    """The graph of a viewer JSON file (write_json's, or circuit-tracer's of the same format): the pruned graph it
    holds, as a Graph. Its feature nodes are the JSON's, its rows the links' weights (the edges pruning dropped are
    zero), its errors every layer's at every position (those the JSON lacks have no edges), its token ids read from
    the embedding nodes' ids "E_T_P". The JSON keeps no logit values (logit - mean logit): they are NaN, and a
    feature's pre-activation is its activation. Recompute the graph from its tokens (graphs.attribute(model,
    graph.token_ids, transcoders)) for the full graph's edges."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        nodes, links, meta = data["nodes"], data["links"], data["metadata"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ResidError(f"{path} is not a graph's viewer JSON ({type(err).__name__}: {err}): give a file resid graph "
                         "--out or graphs.write_json wrote (nodes, links, metadata).") from err
    kinds = {n["node_id"]: n["feature_type"] for n in nodes}
    logits = [n for n in nodes if n["feature_type"] == "logit"]
    if not logits:
        raise ResidError(f"{path} has no logit node: a graph's JSON names the logits it explains.")
    n_layers = int(logits[0]["layer"]) - 1
    tokens = {int(n["ctx_idx"]): int(n["node_id"].split("_")[1]) for n in nodes if n["feature_type"] == "embedding"}
    n_pos = len(meta.get("prompt_tokens", [])) or max(tokens) + 1
    if sorted(tokens) != list(range(n_pos)):
        raise ResidError(f"{path} lacks the token nodes of positions {sorted(set(range(n_pos)) - set(tokens))}: the "
                         "graph's JSON keeps every token node.")
    features = sorted((int(n["node_id"].split("_")[0]), int(n["ctx_idx"]), int(n["node_id"].split("_")[1]))
                      for n in nodes if n["feature_type"] == "cross layer transcoder")
    activation = {n["node_id"]: n.get("activation") or 0.0 for n in nodes}
    logits.sort(key=lambda n: (not n["is_target_logit"], -n["token_prob"]))
    n_f, n_e, n_l = len(features), n_layers * n_pos, len(logits)
    index = {f"{l}_{f}_{p}": i for i, (l, p, f) in enumerate(features)}
    index.update({f"0_{l}_{p}": n_f + l * n_pos + p for l in range(n_layers) for p in range(n_pos)
                  if kinds.get(f"0_{l}_{p}") == "mlp reconstruction error"})
    index.update({f"E_{t}_{p}": n_f + n_e + p for p, t in tokens.items()})
    index.update({n["node_id"]: n_f + n_e + n_pos + k for k, n in enumerate(logits)})
    rows = torch.zeros(n_f + n_l, n_f + n_e + n_pos + n_l)
    for link in links:
        source, target = index.get(link["source"]), index.get(link["target"])
        if source is None or target is None or not (target < n_f or target >= n_f + n_e + n_pos):
            raise ResidError(f"{path}: the link {link['source']} -> {link['target']} joins nodes the JSON does not "
                             "list, or ends at an error or token node (nothing writes into those).")
        rows[target if target < n_f else target - n_e - n_pos, source] = float(link["weight"])
    acts = torch.tensor([float(activation[f"{l}_{f}_{p}"]) for l, p, f in features])
    clerps = [n.get("clerp", "") for n in logits]
    strs = [c[len('Output "'):c.rindex('" (p=')] if c.startswith('Output "') and '" (p=' in c else
            n["node_id"].split("_")[1] for c, n in zip(clerps, logits, strict=True)]
    resid_meta = meta.get("resid", {})
    return Graph(model_name=str(resid_meta.get("model", meta.get("scan", ""))),
                 token_ids=torch.tensor([tokens[p] for p in range(n_pos)]),
                 token_strs=list(meta.get("prompt_tokens", [str(tokens[p]) for p in range(n_pos)])),
                 n_layers=n_layers, features=torch.tensor(features, dtype=torch.long).reshape(-1, 3),
                 activations=acts, pre_activations=acts.clone(),
                 active_features=torch.tensor(features, dtype=torch.long).reshape(-1, 3),
                 logit_tokens=torch.tensor([int(n["node_id"].split("_")[1]) for n in logits]),
                 logit_probabilities=torch.tensor([float(n["token_prob"]) for n in logits]),
                 logit_values=torch.full((n_l,), float("nan")), logit_strs=strs, rows=rows,
                 transcoders=str(meta.get("scan", "")), skip_bos=bool(resid_meta.get("skip_bos", False)),
                 metadata={"from_json": str(path)})
