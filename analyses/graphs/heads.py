"""An attribution graph's edges split by attention head: each edge as the sum of the parts carried by each head of
its last attention hop, plus the part that crosses no attention at all.

    split = graphs.split_heads(model, graph.pruned(), transcoders)   # a HeadSplit of the graph's non-zero edges
    split.of(source, target)     via, weight: one edge's parts (they sum to it); nodes as indices, Sites or labels
    split.to_frame()             source target source_site target_site via weight: every non-zero part

    via     where an edge's last attention hop is: walking back from the target, the first attention sublayer a path
            crosses and the head it crosses it through, as that head's Site at the target's position
            ("layers[3].attn.head[5]@7"); "residual" for the paths that cross no attention (the residual stream and
            the transcoders' skip paths: features and errors are nodes, not paths)
    part    the source's direct effect on the target along the paths of one `via`

The frozen replacement model is linear and each of its paths from a source to a target crosses a last attention
sublayer through one head, or none, so the parts partition the paths and sum to the edge (float rounding). The
residual part of an edge between two positions is zero: only attention moves information across positions.

How: the graph's backward sweep (resid.analyses.graphs.edges) with each target's cotangent split into rows. The
"direct" row starts at the target's read-out and crosses no attention: at each layer it goes through the residual
and the MLP's replacement (the skip path), and its share through the layer's attention, split by head
(Block.frozen_adjoint_heads), starts one row per head; from there a head's row walks down through the whole frozen
blocks like any row of the graph. Contracting a row with the sources' writes gives each source's part via that
row's head. A target has 1 + n_layers * n_heads rows of [pos d_model] and the sweep costs about
n_layers * n_heads / 2 graph sweeps, so the split is meant for a pruned graph (`graph.pruned()`) or a few edges
(`edges=`). The prompt is run again (resid.analyses.graphs.replacement), since a Graph holds no model; its feature
nodes must be features the run finds active with the graph's activations.

circuit-tracer (0.5.0) has no head split, so there is no reference file to compare with: tests/graphs checks the
parts against the frozen model run forward with only some heads' patterns kept.
"""

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from resid.analyses.distributed.driver import drive
from resid.analyses.distributed.execution import Execution, as_execution
from resid.analyses.distributed.executor import Job
from resid.analyses.graphs.attribute import logit_vectors, sweep_batch_size
from resid.analyses.graphs.edges import Sweeper, Targets
from resid.analyses.graphs.graph import Graph
from resid.analyses.graphs.replacement import Replacement, replace
from resid.analyses.graphs.rows import plain_transcoders
from resid.dictionaries.check import on_device
from resid.errors import ResidError, param, python_only
from resid.sites import Site

MAX_PARTS = 1 << 27  # floats a split may hold, n_edges x (1 + n_layers * n_heads): 512 MiB
SWEEP_FLOATS = 1 << 25  # floats of one sweep's rows and their contractions for batch_size "auto": 128 MiB
RESIDUAL = "residual"  # the via of the paths that cross no attention


@dataclass
class HeadSplit:
    """Edges of one graph split by the head of their last attention hop (see the module docstring)."""

    model_name: str
    token_ids: Tensor  # [pos]: the graph's prompt
    sites: list[Site]  # the Site of every node of the graph (graph.sites())
    sources: Tensor  # [e]: each edge's source node
    targets: Tensor  # [e]: its target node
    parts: Tensor  # [e 1 + n_layers * n_heads]: the residual part, then head h of layer l at 1 + l * n_heads + h
    n_heads: int
    _edge: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)  # (source, target) -> edge
    _index: dict[Site, int] = field(default_factory=dict, repr=False)  # node Site -> node

    @property
    def n_edges(self) -> int:
        return len(self.sources)

    @property
    def weights(self) -> Float[Tensor, "edge"]:
        """[e]: each edge, the sum of its parts."""
        return self.parts.sum(1)

    def via(self, column: int, position: int) -> str:
        """The label of part `column` of an edge whose target is at `position`."""
        if column == 0:
            return RESIDUAL
        layer, head = divmod(column - 1, self.n_heads)
        return Site(layer, "attn", head=head, positions=(position,)).label

    def of(self, source, target) -> pd.DataFrame:
        """One edge's non-zero parts: via, weight (they sum to the edge). `source` and `target` are graph nodes: an
        index, a Site or its label (graph.sites())."""
        if not self._edge:
            self._index.update({site: i for i, site in enumerate(self.sites)})
            self._edge.update({(a, b): e for e, (a, b) in enumerate(zip(self.sources.tolist(), self.targets.tolist(),
                                                                         strict=True))})
        s = node_index(self.sites, source, "source", self._index)
        t = node_index(self.sites, target, "target", self._index)
        if (s, t) not in self._edge:
            raise ResidError(f"{self.sites[s].label} -> {self.sites[t].label} is not an edge of this head split (its "
                             f"{self.n_edges} edges are the graph's non-zero ones, or those passed as edges=): "
                             "list them with split.to_frame(), or split the graph that has this edge.")
        parts = self.parts[self._edge[(s, t)]]
        columns = parts.nonzero().flatten().tolist()
        position = self._position(t)
        return pd.DataFrame({"via": [self.via(c, position) for c in columns],
                             "weight": parts[columns].double().numpy()})

    def to_frame(self) -> pd.DataFrame:
        """Every non-zero part: source, target (node indices), source_site, target_site, via, weight."""
        edge, column = self.parts.nonzero(as_tuple=True)
        sources, targets = self.sources[edge].numpy(), self.targets[edge].numpy()
        labels = np.array([site.label for site in self.sites], dtype=object)
        positions = np.array([self._position(node) for node in range(len(self.sites))])
        # the via labels of every (target position, column) pair, made once: a split has millions of parts
        vias = np.array([[self.via(c, p) for c in range(self.parts.shape[1])] for p in range(positions.max() + 1)],
                        dtype=object)
        return pd.DataFrame({"source": sources, "target": targets, "source_site": labels[sources],
                             "target_site": labels[targets], "via": vias[positions[targets], column.numpy()],
                             "weight": self.parts[edge, column].double().numpy()})

    def carriers(self, per_edge: int = 3, limit: int = 200) -> list[tuple[Site, int]]:
        """The heads that carry the edges, as QK attribution asks about them: (a head's Site at an edge's target
        position, the edge's source position), from each edge's `per_edge` largest head parts, the largest parts
        first, each pair once, at most `limit` (resid.analyses.graphs.qk.QK.summaries takes them)."""
        heads = self.parts[:, 1:].abs()
        k = min(per_edge, heads.shape[1])
        values, columns = heads.topk(k, dim=1)
        order = values.flatten().argsort(descending=True)
        found: dict[tuple[Site, int], None] = {}
        for flat in order.tolist():
            edge, rank = divmod(flat, k)
            if float(values[edge, rank]) == 0 or len(found) >= limit:
                break
            layer, head = divmod(int(columns[edge, rank]), self.n_heads)
            target, source = int(self.targets[edge]), int(self.sources[edge])
            site = Site(layer, "attn", head=head, positions=(self._position(target),))
            found.setdefault((site, self._position(source)), None)
        return list(found)

    def __repr__(self) -> str:
        return (f"HeadSplit({self.model_name}, {len(self.token_ids)} tokens, {self.n_edges} edges, "
                f"{self.parts.shape[1]} parts each: the residual and {self.parts.shape[1] - 1} heads)")

    def _position(self, node: int) -> int:
        return int(self.sites[node].positions[0])  # every node of a graph is at one position


def node_index(sites: Sequence[Site], node, role: str = "node", index: dict[Site, int] | None = None) -> int:
    """The index of a graph node given as an index, a Site or a Site's label (`index`: Site -> index, when made
    already)."""
    n = len(sites)
    if isinstance(node, (Site, str)):
        site = Site.parse(node) if isinstance(node, str) else node
        found = (index if index is not None else {s: i for i, s in enumerate(sites)}).get(site)
        if found is None:
            raise ResidError(f"The {role} {site.label} is no node of this graph: give one of graph.sites() (e.g. "
                             f"{sites[0].label}) or a node index 0..{n - 1}.")
        return found
    if isinstance(node, bool) or not hasattr(node, "__index__"):
        raise ResidError(f"The {role} {node!r} is no graph node: give its index (0..{n - 1}), its Site or its label "
                         "(graph.sites()).")
    if not 0 <= int(node) < n:
        raise ResidError(f"The {role} node {int(node)} is out of range: the graph has {n} nodes, 0..{n - 1}.")
    return int(node)


@torch.no_grad()
def split_heads(model, graph: Graph, transcoders, *, edges: Iterable | pd.DataFrame | None = None,
                execution: Execution | None = None) -> HeadSplit:
    """Every non-zero edge of `graph` (or those in `edges`: (source, target) pairs of nodes as indices, Sites or
    labels, or a frame with source and target columns such as graph.edges()) split by the head of its last
    attention hop. `model` and `transcoders` are the ones the graph was built with; the prompt is run again.
    execution (resid.analyses.Execution): batch_size is the targets per backward sweep ("auto": as many as fit
    SWEEP_FLOATS); the sweeps run on the one driver, with its progress, in this process or on executor / workers
    (each runs the prompt again with the transcoders once); the split is assembled here and returned, so it takes
    no out."""
    config = model.config
    if graph.model_name != model.name or graph.n_layers != config.n_layers:
        raise ResidError(f"The graph was built with {graph.model_name} ({graph.n_layers} layers), not {model.name} "
                         f"({config.n_layers} layers): split it with the model and transcoders that built it.")
    sites = graph.sites()
    sources, targets = _edges(graph, sites, edges)
    n_parts = 1 + config.n_layers * config.n_heads
    if len(sources) * n_parts > MAX_PARTS:
        raise ResidError(
            f"Splitting {len(sources)} edges by {n_parts - 1} heads and the residual would hold "
            f"{len(sources) * n_parts} floats (at most {MAX_PARTS}, {MAX_PARTS * 4 / 2**30:.1f} GiB): split a graph "
            f"pruned harder (graph.pruned() with lower node and edge thresholds)"
            + python_only(" or pass edges=[(source, target), ...] for the edges you need") + ".")
    n_sources = graph.n_nodes - graph.n_logits
    per_target = n_parts * (graph.n_pos * config.d_model + 2 * n_sources)  # rows, their contractions, the parts
    batch_size = sweep_batch_size(execution, max(1, SWEEP_FLOATS // per_target))
    with as_execution(execution).started() as execution:
        sweeper = HeadSweeper(_replacement(model, graph, transcoders))
        job = HeadJob(graph, plain_transcoders(sweeper.rep), sources, targets,
                      list(_sweep_order(graph, targets.unique()).split(batch_size)), local=(model, sweeper))
        parts = torch.zeros(len(sources), n_parts)

        def write(chunk, found: tuple[Tensor, Tensor]) -> None:
            here, values = found
            parts[here] = values.cpu()

        drive(model, job, execution, take=write)
    return HeadSplit(graph.model_name, graph.token_ids, sites, sources, targets, parts, config.n_heads)


@dataclass
class HeadJob(Job):
    """split_heads's sweeps as a Job of the one driver: chunks are batches of target nodes, a chunk's result (the
    edges whose targets they are [e], their parts [e n_parts]), on the CPU from a worker. A worker runs the graph's
    prompt again with the transcoders (plain data, as resid.analyses.graphs.rows.RowJob's); in process the state
    is the driver's own (`local`, never sent to a worker)."""

    graph: Graph
    transcoders: tuple  # the checked transcoders (resid.analyses.graphs.rows.plain_transcoders)
    sources: Tensor  # [e]: each edge's source node
    targets: Tensor  # [e]: its target node
    batches: list = field(default_factory=list, repr=False)  # target nodes per sweep (they travel with their chunks)
    local: tuple | None = field(default=None, repr=False, compare=False)  # (model, HeadSweeper) in process

    name = "head split"
    unit = "target"

    def __getstate__(self) -> dict:
        return {**self.__dict__, "local": None}

    def plan(self, done: set, workers: int | None, per_worker: int) -> list[Tensor]:
        planned, self.batches = self.batches, []
        return planned

    def size(self, nodes: Tensor) -> int:
        return len(nodes)

    def setup(self, model) -> tuple:
        if self.local is not None:
            return self.local
        return model, HeadSweeper(_replacement(model, self.graph, list(on_device(self.transcoders, model))))

    def run(self, state: tuple, nodes: Tensor) -> Iterator[tuple[Tensor, Tensor]]:
        model, sweeper = state
        with torch.no_grad():
            found = sweeper.sweep_heads(_targets(model, self.graph, sweeper.rep, nodes))  # [b n_parts n_sources]
        slot = torch.full((self.graph.n_nodes,), -1)
        slot[nodes] = torch.arange(len(nodes))
        here = (slot[self.targets] >= 0).nonzero().flatten()
        yield here, found[slot[self.targets[here]].to(found.device), :, self.sources[here].to(found.device)]

    def combine(self, pieces: list) -> tuple[Tensor, Tensor]:
        return pieces[0]


class HeadSweeper(Sweeper):
    """The graph's Sweeper with each target's cotangent split into a direct row and one row per head it crossed."""

    def sweep_heads(self, targets: Targets) -> Float[Tensor, "batch part source"]:
        """[b 1 + n_layers * n_heads n_sources]: each target's edges from every source, split as HeadSplit.parts."""
        rep = self.rep
        model = rep.model
        n_heads, n_sources, d_model = model.config.n_heads, self.n_sources, rep.embed.shape[-1]
        batch = len(targets.layer)
        n_pos = targets.n_pos  # later positions carry no cotangent (causal attention)
        frozen = rep.frozen.truncated(n_pos)
        device = rep.embed.device
        layers = range(min(targets.top, rep.n_layers - 1), -1, -1)
        direct = torch.zeros(batch, n_sources, device=device)
        g = self.start(targets, frozen, n_pos)
        # the head rows, [spawned row, target, ...]: layers[i]'s heads at i * n_heads.., so the rows spawned above
        # a layer are one leading block that walks down as one batch
        rows = torch.zeros(len(layers) * n_heads, batch, n_pos, d_model, device=device)
        out = torch.zeros(len(layers) * n_heads, batch, n_sources, device=device)
        for i, layer in enumerate(layers):
            block, above = model.blocks[layer], i * n_heads
            if above:
                through = self._through_transcoder(layer, None, frozen, out[:above].view(-1, n_sources), n_pos)
                walked = block.frozen_adjoint(rows[:above].view(-1, n_pos, d_model), frozen.values, through)
                rows[:above] = walked.view(above, batch, n_pos, d_model)
            through = self._through_transcoder(layer, targets, frozen, direct, n_pos)
            g, heads = block.frozen_adjoint_heads(g, frozen.values, through)
            rows[above:above + n_heads] = heads.transpose(0, 1)
        self.contract_tokens(direct, g, n_pos)
        self.contract_tokens(out.view(-1, n_sources), rows.view(-1, n_pos, d_model), n_pos)
        parts = torch.zeros(batch, 1 + rep.n_layers * n_heads, n_sources, device=device)
        parts[:, 0] = direct
        for i, layer in enumerate(layers):
            parts[:, 1 + layer * n_heads:1 + (layer + 1) * n_heads] = out[i * n_heads:(i + 1) * n_heads].transpose(0, 1)
        return parts


def _edges(graph: Graph, sites: list[Site], edges) -> tuple[Tensor, Tensor]:
    """(sources, targets) [e] of the edges to split: the graph's non-zero edges, or the given ones (checked)."""
    nonzero = graph.rows != 0
    if edges is None:
        row, source = nonzero.nonzero(as_tuple=True)
        return source, graph.row_nodes[row]
    pairs = list(zip(edges["source"], edges["target"], strict=True)) if isinstance(edges, pd.DataFrame) else list(edges)
    row_of = torch.full((graph.n_nodes,), -1)
    row_of[graph.row_nodes] = torch.arange(len(graph.row_nodes))
    index = {site: i for i, site in enumerate(sites)}
    sources, targets = [], []
    for pair in pairs:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ResidError(f"{param('edges')} lists (source, target) pairs of graph nodes; got {pair!r}.")
        s, t = node_index(sites, pair[0], "source", index), node_index(sites, pair[1], "target", index)
        if row_of[t] < 0 or not bool(nonzero[row_of[t], s]):
            raise ResidError(f"{sites[s].label} -> {sites[t].label} is no edge of this graph (its weight is zero, or "
                             "pruning removed it): pass edges the graph has (graph.edges() lists them).")
        sources.append(s)
        targets.append(t)
    return torch.tensor(sources, dtype=torch.long), torch.tensor(targets, dtype=torch.long)


def _replacement(model, graph: Graph, transcoders) -> Replacement:
    """The graph's prompt run again with its transcoders, its feature columns the graph's feature nodes (so the
    sweep's sources are the graph's nodes in their order); refused where the run does not find the graph's
    features active with the graph's activations."""
    rep = replace(model, graph.token_ids, transcoders, skip_bos=graph.skip_bos)
    if rep.transcoders.name != graph.transcoders:
        raise ResidError(f"The graph was built with the transcoders {graph.transcoders!r}, not "
                         f"{rep.transcoders.name!r}: split it with the model and transcoders that built it.")
    index = {tuple(f): i for i, f in enumerate(rep.features.tolist())}
    found = torch.tensor([index.get(tuple(f), -1) for f in graph.features.tolist()], dtype=torch.long)
    activations = rep.activations[found.clamp(min=0)].cpu()
    scale = float(graph.activations.abs().max()) if len(found) else 0.0
    same = (found >= 0) & torch.isclose(activations, graph.activations, rtol=1e-3, atol=1e-5 * scale)
    if not bool(same.all()):
        bad = int((~same).nonzero()[0])
        layer, position, feature = graph.features[bad].tolist()
        raise ResidError(f"The graph's feature node {Site(layer, 'mlp', feature=feature, positions=(position,)).label}"
                         f" (activation {float(graph.activations[bad]):.4g}) is not what {model.name} with these "
                         "transcoders finds on the graph's prompt: the graph was built by another model or other "
                         "transcoders. Split it with the ones that built it.")
    return dataclasses.replace(rep, features=rep.features[found], activations=rep.activations[found],
                               pre_activations=rep.pre_activations[found])


def _sweep_order(graph: Graph, nodes: Tensor) -> Tensor:
    """The target nodes sorted by (layer, position), logits last, so a batch spans few layers and positions."""
    layer = torch.full((len(nodes),), graph.n_layers)
    position = torch.full((len(nodes),), graph.n_pos - 1)
    feature = nodes < graph.n_features
    layer[feature], position[feature] = graph.features[nodes[feature], 0], graph.features[nodes[feature], 1]
    return nodes[torch.argsort(layer * graph.n_pos + position, stable=True)]


def _targets(model, graph: Graph, rep: Replacement, nodes: Tensor) -> Targets:
    """The read-outs of target nodes: a feature's encoder column at its layer and position, a logit's demeaned
    unembedding column after the final norm at the last position."""
    n = len(nodes)
    layer = torch.full((n,), graph.n_layers)
    position = torch.full((n,), graph.n_pos - 1)
    vectors = torch.zeros(n, model.config.d_model, device=rep.embed.device)  # a transcoder reads d_model too
    feature = nodes < graph.n_features
    for i in feature.nonzero().flatten().tolist():
        l, p, f = graph.features[nodes[i]].tolist()
        layer[i], position[i] = l, p
        vectors[i] = rep.transcoders.encoder(l, torch.tensor([f]))[0]
    logits = (~feature).nonzero().flatten()
    if len(logits):
        tokens = graph.logit_tokens[nodes[logits] - (graph.n_nodes - graph.n_logits)]
        vectors[logits] = logit_vectors(model, tokens)
    return Targets(layer, position, vectors)
