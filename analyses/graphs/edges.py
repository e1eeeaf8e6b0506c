"""Rows of the adjacency matrix: the direct effect of every source node on a batch of target nodes, in one
backward sweep per batch through the model's own frozen blocks (Block.frozen_adjoint, with the frozen values of
resid.analyses.graphs.frozen) and its readout (Readout.frozen_adjoint).

A target is a linear read-out of the residual at one place: a feature's pre-activation reads the residual its
MLP reads at its position through the encoder column (x . W_enc[:, f]); a logit node reads the final residual at
the last position through the final norm and a demeaned unembedding column. The sweep starts from each target's
read-out vector (its cotangent), walks down the layers through each block's adjoint (the attention with its
pattern fixed, the frozen norms, the block's topology) and, in place of the MLP, the transcoder's (its skip path),
and on the way contracts the cotangent with every source's write:

    feature (l, p, f)  a * W_dec[f] . G_t[p]  for each layer t it writes into (G_t: the cotangent on layer t's
                       MLP output space)
    error (l, p)       error[l, p] . G_l[p]
    token p            embed[p] . g_0[p]      (g_0: the cotangent on the residual entering layer 0)

Because every map is linear with the freezes, each contraction is exactly the source's direct effect, and the
effects into a target plus its constant terms sum to its value (resid.analyses.graphs tests this). A batch only
spans the layers and positions below its highest target (later ones carry no cotangent). Features are contracted
per position in one batched matmul (their decoder rows laid out [pos m d], m the most features any position has),
so memory stays linear in the number of active features and nothing of size [batch features d] is built.

Columns are ordered as circuit-tracer orders its nodes: features (as `Replacement.features`), errors (layer by
layer, each position), tokens (each position).
"""

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from resid.analyses.graphs.frozen import Frozen
from resid.analyses.graphs.replacement import Replacement

CACHE_FLOATS = 1 << 28  # decoder layouts kept between sweeps: at most this many floats (1 GiB)


@dataclass
class Targets:
    """A batch of targets: `layer` n_layers for a logit node (read after the final norm), else a feature's layer.
    Which targets start at which layer is read to the host once, when the batch is made (`at`), so that the sweep
    through the layers asks the device for nothing."""

    layer: Tensor  # [b]
    position: Tensor  # [b]
    vector: Tensor  # [b d]: d_in for a feature (its encoder column), d_model for a logit (after the final norm)
    # layer -> (the targets starting there [k], their positions [k]), on the vectors' device; n_layers: the logits
    at: dict[int, tuple[Tensor, Tensor]] = field(init=False, repr=False)
    top: int = field(init=False)  # the highest target layer (-1 without targets)
    n_pos: int = field(init=False)  # one past the last target position (0 without targets)

    def __post_init__(self) -> None:
        layers, positions = self.layer.tolist(), self.position.tolist()
        grouped: dict[int, tuple[list[int], list[int]]] = {}
        for i, (layer, position) in enumerate(zip(layers, positions, strict=True)):
            rows, at = grouped.setdefault(layer, ([], []))
            rows.append(i)
            at.append(position)
        device = self.vector.device
        self.at = {layer: (torch.tensor(rows, device=device), torch.tensor(at, device=device))
                   for layer, (rows, at) in grouped.items()}
        self.top, self.n_pos = max(layers, default=-1), max(positions, default=-1) + 1


class Sweeper:
    def __init__(self, rep: Replacement):
        self.rep = rep
        self.n_features = int(rep.features.shape[0])
        self.n_sources = self.n_features + (rep.n_layers + 1) * rep.n_pos
        t = rep.transcoders
        # the decoder rows of each (source, target) pair, scaled by the activations: built on first use
        self._decoders: dict[tuple[int, int], tuple[Tensor, Tensor]] = {}
        self._cached = 0
        self._features = rep.features.cpu().numpy()  # [n 3] on the host: the decoders' layouts are made there
        self._by_layer = [np.flatnonzero(self._features[:, 0] == l) for l in range(rep.n_layers)]
        self._sources_into = [[s for s in range(rep.n_layers) if l in t.targets(s)] for l in range(rep.n_layers)]
        self._skips = [t.skip(l) for l in range(rep.n_layers)]  # W_skip [d_in d_out] per layer, or None

    def error_columns(self, layer: int) -> slice:
        start = self.n_features + layer * self.rep.n_pos
        return slice(start, start + self.rep.n_pos)

    def token_columns(self) -> slice:
        start = self.n_features + self.rep.n_layers * self.rep.n_pos
        return slice(start, start + self.rep.n_pos)

    def decoders(self, source: int, target: int) -> "Layout":
        """`source`'s active features writing into `target`, laid out by position (see Layout). Kept for the next
        sweeps while they fit in CACHE_FLOATS (a cross-layer transcoder has a layout per source and target layer).
        The layout is computed on the host from the features' bookkeeping: only the decoder rows touch the device."""
        key = (source, target)
        if key not in self._decoders:
            rows = self._by_layer[source]
            features = self._features[rows]
            device = self.rep.activations.device
            weights = (self.rep.transcoders.decoder(source, target, torch.as_tensor(features[:, 2]))
                       * self.rep.activations[torch.as_tensor(rows, device=device), None])
            positions = features[:, 1]
            counts = np.bincount(positions, minlength=self.rep.n_pos)
            width = max(1, int(counts.max()) if len(counts) else 1)
            slot = np.arange(len(rows)) - (np.cumsum(counts) - counts)[positions]  # rank within its position
            padded = torch.zeros(self.rep.n_pos, width, weights.shape[-1], device=weights.device)
            padded[torch.as_tensor(positions, device=weights.device), torch.as_tensor(slot, device=weights.device)] \
                = weights
            # position-major, so the features of the first p positions are the first before[p] entries
            flat = positions * width + slot
            order = np.argsort(flat, kind="stable")
            before = np.concatenate([[0], np.cumsum(counts)])
            layout = Layout(padded, torch.as_tensor(flat[order], device=weights.device),
                            torch.as_tensor(rows[order], device=weights.device), before.tolist())
            if self._cached + padded.numel() > CACHE_FLOATS:
                return layout
            self._cached += padded.numel()
            self._decoders[key] = layout
        return self._decoders[key]

    def sweep(self, targets: Targets) -> Tensor:
        """[b n_sources]: the direct effect of every source on each target."""
        rep = self.rep
        n_layers = rep.n_layers
        batch = int(targets.layer.shape[0])
        if batch == 0:  # no targets: a prompt where no feature fires (splitting nothing gives one empty chunk)
            return torch.zeros(0, self.n_sources)
        top = targets.top
        n_pos = targets.n_pos  # later positions carry no cotangent (causal attention)
        frozen = rep.frozen.truncated(n_pos)
        device = rep.embed.device  # the model's: the sweep runs there, the rows come back to the CPU
        out = torch.zeros(batch, self.n_sources, device=device)
        g = self.start(targets, frozen, n_pos)
        for layer in range(min(top, n_layers - 1), -1, -1):
            through = self._through_transcoder(layer, targets, frozen, out, n_pos)
            g = rep.model.blocks[layer].frozen_adjoint(g, frozen.values, through)
        self.contract_tokens(out, g, n_pos)
        return out.cpu()

    def start(self, targets: Targets, frozen: Frozen, n_pos: int) -> Tensor:
        """[b pos d_model]: the cotangents on the final residual, the logit targets' read-outs through the final
        norm at their positions (feature targets join lower down, at their layer)."""
        g = torch.zeros(len(targets.layer), n_pos, self.rep.embed.shape[-1], device=self.rep.embed.device)
        if self.rep.n_layers in targets.at:
            index, positions = targets.at[self.rep.n_layers]
            g[index, positions] += self.rep.model.readout.frozen_adjoint(targets.vector[index],
                                                                         frozen.final_scale[positions])
        return g

    def contract_tokens(self, out: Tensor, g: Tensor, n_pos: int) -> None:
        """out's token columns: each position's embedding write against the cotangent g [b pos d_model] on the
        residual entering layer 0."""
        cols = self.token_columns()
        out[:, cols.start:cols.start + n_pos] = torch.einsum("bpd,pd->bp", g, self.rep.embed[:n_pos])

    def _through_transcoder(self, layer: int, targets: Targets | None, frozen: Frozen, out: Tensor, n_pos: int):
        """The adjoint of layer's MLP replaced by its transcoder, for Block.frozen_adjoint: contracts the cotangent
        on its write with the layer's error and feature writes into `out`, then adds to the cotangent on the
        residual the MLP reads what the skip path carries back and the read-out vectors of the layer's targets
        (None: rows that start at no target, resid.analyses.graphs.heads's head rows)."""
        rep = self.rep

        def adjoint(g_write: Tensor, g_read: Tensor) -> Tensor:
            # the transcoder's output is the MLP's whole write: g_write is its cotangent as it is
            cols = self.error_columns(layer)
            out[:, cols.start:cols.start + n_pos] = torch.einsum("bpd,pd->bp", g_write, rep.errors[layer, :n_pos])
            for source in self._sources_into[layer]:
                self._contract(out, g_write, self.decoders(source, layer), n_pos)
            skip = self._skips[layer]
            if skip is not None:  # before g_read is added to in place: it may be g_write itself
                g_read = g_read + rep.transcoder_input_adjoint(layer, g_write @ skip.T, frozen)
            if targets is not None:
                self._inject(g_read, targets, layer, frozen)
            return g_read
        return adjoint

    def _inject(self, g: Tensor, targets: Targets, layer: int, frozen: Frozen) -> None:
        """Add the read-out vectors of the feature targets of `layer` at their positions."""
        if layer not in targets.at:
            return
        here, positions = targets.at[layer]
        g[here, positions] += self.rep.transcoder_input_adjoint(layer, targets.vector[here], frozen, positions)

    @staticmethod
    def _contract(out: Tensor, g_out: Tensor, layout: "Layout", n_pos: int) -> None:
        """out[:, columns] += a * W_dec . G[position] for the features at positions below n_pos: one batched
        matmul over positions, [pos b d] @ [pos d m], no per-feature gather, and one gather of the slots that
        hold a feature (index tensors made with the layout: no mask read back per sweep)."""
        padded = layout.padded[:n_pos]
        products = torch.bmm(g_out.transpose(0, 1), padded.transpose(1, 2))  # [pos b m]
        count = layout.before[n_pos]
        found = products.permute(1, 0, 2).reshape(len(out), -1).index_select(1, layout.slots[:count])
        out[:, layout.columns[:count].to(out.device)] += found


@dataclass(frozen=True)
class Layout:
    """The active features of one source layer writing into one target layer, laid out by position: their decoder
    rows scaled by the activations, [pos m d_out] (m the most features any position has, zero where a position has
    fewer); the slots that hold a feature (flat indices into [pos m], position-major) and each one's column of the
    adjacency matrix; before[p]: how many of them sit at positions below p."""

    padded: Tensor
    slots: Tensor
    columns: Tensor
    before: list[int]
