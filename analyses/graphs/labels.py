"""Short labels of a graph's features without a language model: what each feature writes, what it reads, and where
it fires most, as the few words a graph viewer shows beside a node (Neuronpedia's `clerp` field).

    outputs   the tokens its decoder promotes most: its write into the residual stream (every target layer's for a
              cross-layer transcoder, summed) read through the unembedding with the final norm's gain and centering
              folded in (model.readout.unembedding; the norm's input-dependent scale is positive and the same for
              every token, so it leaves the ranking alone): "norm-aware"
    inputs    the tokens whose own embedding excites it most: its encoder column as a direction on the residual
              stream (through the MLP's input norm's gain, or centred, as the transcoder reads), against every
              token's embedding
    context   its top-activating corpus context (resid.analyses.features.top_activating's table, the feature cards'
              data), when one is given: the marked token and the few before it

    table = graphs.labels(model, graph, transcoders, examples=features.top_activating(model, tcs, corpus.demo()))
    table["label"]   # 'out: " Paris" " Rome" | in: " France" | ctx: "capital of ⟦ France⟧"'

One row per (layer, feature) of the graph's feature nodes (a feature at several positions is one row); `key` is
"L_F", the part of a node id "L_F_P" without its position, which the viewer and export.graph_json look labels up by.
"""

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from resid.analyses.checks import check_k
from resid.analyses.features.views import encoder_directions
from resid.analyses.graphs.graph import Graph
from resid.analyses.graphs.transcoders import Transcoders
from resid.analyses.neurons.keys import MARK
from resid.analyses.vocab import decode_ids
from resid.errors import ResidError

CHUNK = 256  # features whose [chunk d_vocab] logits are read at once
CONTEXT_CHARS = 24  # characters of context kept before the marked token


def labels(model, graph: Graph, transcoders, examples: pd.DataFrame | None = None, k: int = 3,
           nodes: Tensor | None = None) -> pd.DataFrame:
    """One row per (layer, feature) of `graph`'s feature nodes (or of the feature nodes `nodes` [n], indices into
    graph.features): key ("L_F"), layer, feature, outputs and inputs (its k top tokens, see the module docstring),
    context (the top row of `examples` for it, "" without one) and label (the three, short)."""
    k = check_k(k, "k", model.config.d_vocab)
    found = Transcoders.of(model, transcoders)
    chosen = graph.features if nodes is None else graph.features[nodes]
    pairs = sorted({(int(l), int(f)) for l, _, f in chosen.tolist()})
    if not pairs:
        return pd.DataFrame({c: [] for c in ("key", "layer", "feature", "outputs", "inputs", "context", "label")})
    contexts = _contexts(examples, found)
    layers = np.array([l for l, _ in pairs])
    outputs, inputs = [None] * len(pairs), [None] * len(pairs)
    with torch.no_grad():
        unembed = model.readout.unembedding(True)
        vocab = torch.arange(model.config.d_vocab, device=model.device)[None]
        embeddings = model.embed(vocab)[0].float()
        for layer in sorted(set(layers.tolist())):
            where = np.flatnonzero(layers == layer)
            features = torch.tensor([pairs[i][1] for i in where], device=unembed.device)
            for start in range(0, len(where), CHUNK):
                part, ids = where[start:start + CHUNK], features[start:start + CHUNK]
                written = sum(found.decoder(layer, target, ids) for target in found.targets(layer))
                top_out = (written.to(unembed.device) @ unembed).topk(k, dim=-1).indices.cpu().numpy()
                read = _encoder_on_residual(model, found, layer, ids).to(embeddings.device)
                top_in = (read @ embeddings.T).topk(k, dim=-1).indices.cpu().numpy()
                for row, out_ids, in_ids in zip(part, top_out, top_in, strict=True):
                    outputs[row] = list(decode_ids(model, out_ids))
                    inputs[row] = list(decode_ids(model, in_ids))
    ctx = [contexts.get(pair, "") for pair in pairs]
    return pd.DataFrame({
        "key": [f"{l}_{f}" for l, f in pairs], "layer": layers.astype(np.int64),
        "feature": np.array([f for _, f in pairs], dtype=np.int64), "outputs": outputs, "inputs": inputs,
        "context": ctx, "label": [label(o, i, c) for o, i, c in zip(outputs, inputs, ctx, strict=True)],
    })


def label(outputs: list[str], inputs: list[str], context: str = "") -> str:
    """The short label of one feature: 'out: " a" " b" | in: " c" | ctx: "...⟦ d⟧"'."""
    parts = ["out: " + " ".join(_quoted(t) for t in outputs), "in: " + " ".join(_quoted(t) for t in inputs)]
    if context:
        parts.append(f"ctx: {_quoted(context)}")
    return " | ".join(parts)


def by_key(table: pd.DataFrame) -> dict[str, str]:
    """{"L_F": label} of a labels() table: what export.graph_json and the viewer take."""
    return dict(zip(table["key"], table["label"], strict=True))


def _quoted(token: str) -> str:
    return '"' + token.replace("\n", "⏎").replace("\t", "→").replace('"', "'") + '"'


def _encoder_on_residual(model, found: Transcoders, layer: int, features: Tensor) -> Tensor:
    """What `layer`'s features read, as directions on the residual stream [n d_model]: a per-layer transcoder's
    through features.views (the one rule for a dictionary's input norm); a cross-layer transcoder's columns
    through the MLP's input norm the same way (fold its gain, or centre for a standardized input)."""
    if found.per_layer is not None:
        return encoder_directions(model, found.per_layer[layer], features.tolist())
    columns = found.encoder(layer, features.cpu())
    point = found.points_in[layer]
    if point.site.what != "normalized":  # the residual itself
        return columns
    norm = point.norm(model)
    return norm.centred(columns) if point.standardized else norm.fold(columns)


def _contexts(examples: pd.DataFrame | None, found: Transcoders) -> dict[tuple[int, int], str]:
    """{(layer, feature): its top context, cut to CONTEXT_CHARS before the marked token and the mark's end} from a
    features.top_activating table of these transcoders."""
    if examples is None or not len(examples):
        return {}
    missing = [c for c in ("layer", "feature", "rank", "context") if c not in examples.columns]
    if missing:
        raise ResidError(f"examples= takes features.top_activating's table (columns layer, feature, rank, context); "
                         f"this one lacks {missing}.")
    names = {d.name for d in found.dictionaries}
    rows = examples
    if "dictionary" in examples.columns:
        rows = examples[examples["dictionary"].isin(names)]
    rows = rows.sort_values(["layer", "feature", "rank"], kind="stable").drop_duplicates(["layer", "feature"])
    out = {}
    for layer, feature, text in zip(rows["layer"], rows["feature"], rows["context"], strict=True):
        start, end = text.find(MARK[0]), text.find(MARK[1])
        if start < 0 or end < 0:
            out[(int(layer), int(feature))] = text[:CONTEXT_CHARS]
            continue
        out[(int(layer), int(feature))] = text[max(0, start - CONTEXT_CHARS):end + 1].lstrip()
    return out
