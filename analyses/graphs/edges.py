"""Rows of the adjacency matrix: the direct effect of every source node on a batch of target nodes, in one
backward sweep through the frozen linear maps (resid.analyses.graphs.frozen) per batch.

A target is a linear read-out of the residual at one place: a feature's pre-activation reads the residual its
MLP reads at its position through the encoder column (x . W_enc[:, f]); a logit node reads the final residual at
the last position through the final norm and a demeaned unembedding column. The sweep starts from each target's
read-out vector (its cotangent), walks down the layers through the adjoints of the frozen attention (patterns
fixed), the frozen norms and any skip path, and on the way contracts the cotangent with every source's write:

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

from dataclasses import dataclass

import torch
from torch import Tensor

from resid.analyses.graphs.frozen import Frozen
from resid.analyses.graphs.replacement import Replacement

CACHE_FLOATS = 1 << 28  # decoder layouts kept between sweeps: at most this many floats (1 GiB)


@dataclass
class Targets:
    """A batch of targets: `layer` n_layers for a logit node (read after the final norm), else a feature's layer."""

    layer: Tensor  # [b]
    position: Tensor  # [b]
    vector: Tensor  # [b d]: d_in for a feature (its encoder column), d_model for a logit (after the final norm)


class Sweeper:
    def __init__(self, rep: Replacement):
        self.rep = rep
        self.n_features = int(rep.features.shape[0])
        self.n_sources = self.n_features + (rep.n_layers + 1) * rep.n_pos
        t = rep.transcoders
        # the decoder rows of each (source, target) pair, scaled by the activations: built on first use
        self._decoders: dict[tuple[int, int], tuple[Tensor, Tensor]] = {}
        self._cached = 0
        self._by_layer = [torch.nonzero(rep.features[:, 0] == l).flatten() for l in range(rep.n_layers)]
        self._sources_into = [[s for s in range(rep.n_layers) if l in t.targets(s)] for l in range(rep.n_layers)]

    def error_columns(self, layer: int) -> slice:
        start = self.n_features + layer * self.rep.n_pos
        return slice(start, start + self.rep.n_pos)

    def token_columns(self) -> slice:
        start = self.n_features + self.rep.n_layers * self.rep.n_pos
        return slice(start, start + self.rep.n_pos)

    def decoders(self, source: int, target: int) -> tuple[Tensor, Tensor]:
        """`source`'s active features writing into `target`, laid out by position: (columns [pos m], -1 where a
        position has fewer than m features; a * W_dec rows [pos m d_out], zero there). Kept for the next sweeps
        while they fit in CACHE_FLOATS (a cross-layer transcoder has a layout per source and target layer)."""
        key = (source, target)
        if key not in self._decoders:
            rows = self._by_layer[source]
            features = self.rep.features[rows]
            weights = self.rep.transcoders.decoder(source, target, features[:, 2]) * self.rep.activations[rows, None]
            positions = features[:, 1]
            counts = torch.bincount(positions, minlength=self.rep.n_pos)
            width = max(1, int(counts.max()) if len(counts) else 1)
            slot = torch.arange(len(rows)) - (torch.cumsum(counts, 0) - counts)[positions]  # rank within position
            columns = torch.full((self.rep.n_pos, width), -1, dtype=torch.long)
            padded = torch.zeros(self.rep.n_pos, width, weights.shape[-1], device=weights.device)
            columns[positions, slot] = rows
            padded[positions, slot] = weights
            if self._cached + padded.numel() > CACHE_FLOATS:
                return columns, padded
            self._cached += padded.numel()
            self._decoders[key] = (columns, padded)
        return self._decoders[key]

    def sweep(self, targets: Targets) -> Tensor:
        """[b n_sources]: the direct effect of every source on each target."""
        rep, frozen = self.rep, self.rep.frozen
        n_layers = rep.n_layers
        batch = int(targets.layer.shape[0])
        top = int(targets.layer.max())
        n_pos = int(targets.position.max()) + 1  # later positions carry no cotangent (causal attention)
        view = _truncated(frozen, n_pos)
        device = rep.embed.device  # the model's: the sweep runs there, the rows come back to the CPU
        out = torch.zeros(batch, self.n_sources, device=device)
        g = torch.zeros(batch, n_pos, rep.embed.shape[-1], device=device)
        logit = targets.layer == n_layers
        if bool(logit.any()):
            index = logit.nonzero().flatten()
            positions = targets.position[index]
            g[index, positions] += frozen.final_adjoint(targets.vector[index], positions)
        for layer in range(min(top, n_layers - 1), -1, -1):
            g_out = view.write_adjoint(layer, g)  # [b pos d_out]
            errors = rep.errors[layer, :n_pos]
            cols = self.error_columns(layer)
            out[:, cols.start:cols.start + n_pos] = torch.einsum("bpd,pd->bp", g_out, errors)
            for source in self._sources_into[layer]:
                self._contract(out, g_out, *self.decoders(source, layer), n_pos)
            skip = view.skip_adjoint(layer, g_out)
            if not view.parallel:
                if skip is not None:
                    g = g + skip
                self._inject(g, targets, layer, view)
                g = g + view.attn_adjoint(layer, g)
            else:
                g_new = g + view.attn_adjoint(layer, g)
                if skip is not None:
                    g_new = g_new + skip
                self._inject(g_new, targets, layer, view)
                g = g_new
        cols = self.token_columns()
        out[:, cols.start:cols.start + n_pos] = torch.einsum("bpd,pd->bp", g, rep.embed[:n_pos])
        return out.cpu()

    def _inject(self, g: Tensor, targets: Targets, layer: int, view: Frozen) -> None:
        """Add the read-out vectors of the feature targets of `layer` at their positions."""
        here = (targets.layer == layer).nonzero().flatten()
        if not len(here):
            return
        positions = targets.position[here]
        scale = view.scales.get((layer, "mlp"))
        scale = None if scale is None else scale[positions]
        vectors = view.input_adjoint(layer, targets.vector[here], scale)
        g[here, positions] += vectors

    @staticmethod
    def _contract(out: Tensor, g_out: Tensor, columns: Tensor, padded: Tensor, n_pos: int) -> None:
        """out[:, columns] += a * W_dec . G[position] for the features at positions below n_pos: one batched
        matmul over positions, [pos b d] @ [pos d m], no per-feature gather."""
        columns, padded = columns[:n_pos], padded[:n_pos]
        products = torch.bmm(g_out.transpose(0, 1), padded.transpose(1, 2))  # [pos b m]
        valid = columns >= 0
        out[:, columns[valid].to(out.device)] += products.permute(1, 0, 2)[:, valid.to(out.device)]


def _truncated(frozen: Frozen, n_pos: int) -> Frozen:
    """The frozen maps restricted to the first n_pos positions (exact under causal attention)."""
    if n_pos == frozen.final_scale.shape[0]:
        return frozen
    return Frozen(frozen.model, [p[:, :n_pos, :n_pos] for p in frozen.patterns],
                  {key: s[:n_pos] for key, s in frozen.scales.items()}, frozen.final_scale[:n_pos], frozen.reads,
                  frozen.before_post_norm, frozen.skips)
