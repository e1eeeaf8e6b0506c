"""The terms of an edge-patched pass (resid.analyses.circuits.patched): every reader's input is its base (the
pass's residual, or the reference's read) plus

    sum_w weight[c, w, r] difference_w        (weight 1 - keep and difference reference - write: the first form;
                                               keep and write - reference: the second)

over the writers before it. Only the writers with a term in some circuit of the pass keep their difference, each as
its own rows [b pos d_model] of one [column b pos d_model] tensor, written as the writer runs; a layer's attention
readers (which read the same writers; in a parallel block its MLP too) gather their terms together in one batched
matrix product, into reader-major sums [r b pos d_model] that each head's projection takes as they are; and where
that reads the differences less often, a block of BLOCK_LAYERS layers gathers every one of its readers' terms from
the writers before the block once, each layer then only its block's own columns.

In the second form, where the reference is a run (Writes.computed), a node none of whose inputs has a term computes
the reference's write, so its difference is zero: its terms are dropped (`live`, in stream order).

Glossary: C the circuits of the pass, b = C * n its rows, r a group's readers.
"""

import numpy as np
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from resid.analyses.circuits.graph import EdgeGraph

# layers whose readers' terms from the writers before them are gathered together (Terms._block): each span (a
# layer's attention readers, its MLP) then reads only its own block's difference columns
BLOCK_LAYERS = 4


class Terms:
    """The terms of one pass: `keep` [circuit writer reader] on the host (numpy) and on the device (the weights),
    `second` the form."""

    def __init__(self, graph: EdgeGraph, host: np.ndarray, keep: Tensor, second: bool, computed: bool):
        """`computed`: the reference is a run (its nodes' writes follow from their reads), so that in the second
        form the terms of nodes no term reaches are dropped."""
        self.graph, self.circuits = graph, keep.shape[0]
        terms = ((host != 0) if second else (host != 1)).any(0) & graph.valid.numpy()  # [writer reader]
        if second and computed:
            terms = live(graph, terms)
        self.has_term = terms.any(0)  # [reader]
        self.used = terms.any(1)  # [writer]: kept as a column of the differences
        self.before_column = np.concatenate([[0], np.cumsum(self.used)])  # columns of the writers before each
        keep = keep[:, torch.as_tensor(np.flatnonzero(self.used), device=keep.device)]
        self.weight = keep if second else 1 - keep  # [circuit column reader]
        # the differences, [column b pos d_model], kept as each writer runs for the readers after it; with gradients
        # a list of (columns, difference)
        self.diffs: Tensor | list | None = None
        self.gathered: tuple[slice, Tensor] | None = None  # the last span's sums (of)
        self.accumulated: tuple[slice, int, Tensor] | None = None  # the last block's (_block)

    def any(self, readers: slice) -> bool:
        """Whether some reader of `readers` has a term in some circuit."""
        return bool(self.has_term[readers].any())

    def spreads(self, writers: slice) -> bool:
        """Whether a writer group has a term in some circuit of the pass (its differences are kept)."""
        return bool(self.used[writers].any())

    def spread(self, writers: slice, diff: Float[Tensor, "b pos w d_model"]) -> None:
        """Keep the differences of a writer group's writers that have a term (their columns: rows [w b pos d_model]
        of `diffs`, each writer's contiguous) for the readers after it."""
        used = self.used[writers]
        if not used.all():
            diff = diff[:, :, torch.as_tensor(np.flatnonzero(used), device=diff.device)]
        diff = diff.permute(2, 0, 1, 3)
        columns = slice(int(self.before_column[writers.start]), int(self.before_column[writers.stop]))
        if self.diffs is None:
            shape = (int(self.before_column[-1]), *diff.shape[1:])
            # every column is written by its writer before a reader after it reads it
            self.diffs = torch.empty(shape, dtype=diff.dtype, device=diff.device) if not torch.is_grad_enabled() \
                else []
        if isinstance(self.diffs, list):  # with gradients: kept apart, concatenated where read
            self.diffs.append((columns, diff))
        else:
            self.diffs[columns] = diff

    def of(self, layer: int | None, field: str) -> Float[Tensor, "r b pos d_model"] | None:
        """sum_w weight[w, r] difference_w over the writers before a reader group: one batched matrix product over
        the columns of those writers, shared by the readers of `_span` (None where the group has no term)."""
        columns = self.graph.reader_slice(layer, field)
        if self.diffs is None or not self.any(columns):
            return None
        span, offset = self._span(layer, field)
        if self.gathered is None or self.gathered[0] != span:
            before = int(self.before_column[self.graph.writers_before(layer, field)])
            block = self._block(layer)
            if block is None:
                self.gathered = (span, self._gather(0, before, span))
            else:  # the block's sums up to its first layer, then this span's own columns
                readers, start, sums = block
                own = sums[span.start - readers.start:span.stop - readers.start]
                self.gathered = (span, own + self._gather(start, before, span) if before > start else own)
        return self.gathered[1][offset:offset + columns.stop - columns.start]

    def _span(self, layer: int | None, field: str) -> tuple[slice, int]:
        """The readers whose terms are gathered together with the group's (a layer's attention readers, which read
        the same writers; in a parallel block its MLP too), and the group's offset among them."""
        graph, columns = self.graph, self.graph.reader_slice(layer, field)
        if layer is None or field not in graph.attn_fields + (("mlp",) if graph.parallel else ()):
            return columns, 0
        span = graph.attn_readers(layer)
        if graph.parallel:
            span = slice(span.start, graph.reader_slice(layer, "mlp").stop)
        return span, columns.start - span.start

    def _block(self, layer: int | None) -> tuple[slice, int, Tensor] | None:
        """The readers of `layer`'s block of BLOCK_LAYERS layers, the difference columns before the block and every
        one of its readers' terms from those columns, gathered once for the block (where that reads the columns
        less often than each span reading them all; None otherwise)."""
        graph = self.graph
        if layer is None or isinstance(self.diffs, list) or graph.cross:
            return None
        first = layer - layer % BLOCK_LAYERS
        if self.accumulated is not None and self.accumulated[0].start == graph.reader_slice(first, "q").start:
            return self.accumulated
        last = min(first + BLOCK_LAYERS, graph.n_layers) - 1
        readers = slice(graph.reader_slice(first, "q").start, graph.reader_slice(last, "mlp").stop)
        start = int(self.before_column[graph.writers_before(first, "q")])
        fields = (graph.attn_fields[0],) if graph.parallel else (graph.attn_fields[0], "mlp")
        spans = sum(self.any(self._span(l, f)[0]) for l in range(first, last + 1) for f in fields)
        if start * (spans - 1) <= 2 * (readers.stop - readers.start):
            return None
        self.accumulated = (readers, start, self._gather(0, start, readers))
        return self.accumulated

    def _gather(self, start: int, stop: int, readers: slice) -> Float[Tensor, "r b pos d_model"]:
        """sum over the difference columns start..stop-1, weighted, for the readers `readers`."""
        if isinstance(self.diffs, list):  # a writer group's columns are all before a reader group or all after it
            diffs = torch.cat([diff for columns, diff in self.diffs if columns.start < stop])[start:]
        else:
            diffs = self.diffs[start:stop]
        w, b, n_pos, d_model = diffs.shape
        weight = self.weight[:, start:stop, readers].to(diffs.dtype).transpose(1, 2)  # [C r w]
        out = torch.bmm(weight, diffs.view(w, self.circuits, -1).transpose(0, 1))  # [C r (n pos d_model)]
        out = out.view(self.circuits, -1, b // self.circuits, n_pos, d_model).transpose(0, 1)
        return out.reshape(-1, b, n_pos, d_model)


def live(graph: EdgeGraph, terms: Bool[Tensor, "writer reader"] | np.ndarray) -> np.ndarray:
    """The terms of the second form that can be nonzero: those whose writer's node is reached from the embeddings
    through terms (a node none of whose inputs has a term computes its reference's write, so its difference is
    zero). `terms` [writer reader] bool."""
    terms = np.asarray(terms, dtype=bool)
    feeds = graph.feeds.numpy()  # [reader writer]
    reached = np.array([site.part == "embed" for site in graph.writers])
    for writers, columns in graph.stages():  # in stream order, as pruning walks it
        read = (terms[:, columns] & reached[:, None]).any(0)
        reached[writers] = (feeds[columns][:, writers] & read[:, None]).any(0)
    return terms & reached[:, None]
