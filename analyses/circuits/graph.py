"""The edge graph of a model: who writes into the residual stream, who reads from it, and which writes each reader
sees (Syed et al. 2023; Hanna et al. 2024). Every node is a resid.Site and every edge a pair of them.

Glossary:
    writer   a node whose output is added to the stream: the embeddings (`embed`, every embedding write together),
             each query head h of layer l (`layers[l].attn.head[h]`, its write z[h] @ W_O[h]), each MLP
             (`layers[l].mlp`, the whole sublayer, a mixture of experts included)
    reader   a node whose input is read from the stream: each query head's q (`layers[l].attn.head[h].q`), each
             key/value head's k and v (`layers[l].attn.kv_head[g].k | .v`: under GQA and MQA shared by its query
             heads, one reader, never one per query head), each MLP, and the logits (`logits`)
    edge     (writer, reader) with the writer before the reader: a reader's input is the sum of the writes before
             it (plus constants), so an edge is one term of that sum, and patching it swaps that one term
    keep     [writer reader] (or [circuit writer reader]) weights of the terms: 1 keeps the edge's value of the
             running pass, 0 puts the corrupt (or mean) value in its place; fractions interpolate (EAP-IG on the
             activations); the entries of non-edges are ignored

A sequential block's heads read resid_pre and its MLP resid_mid (so the MLP reads the heads of its own layer);
a parallel block's heads and MLP both read resid_pre. Models whose stream is not a plain sum of writes (post-LN,
post-norms, which norm a head's write together with the other heads'), latent attention (its keys and values share
one compressed latent), models without pre-norms and encoder-decoders are refused with the reason (`supported`).
"""

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
from jaxtyping import Bool
from torch import Tensor

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.sites import Site

EMBED = Site(None, "embed")
LOGITS = Site(None, "logits")


def supported(config: ModelConfig) -> None:
    """Refuse, by name, what the edge graph cannot split into a sum of writes."""
    reasons = []
    if config.post_ln:
        reasons.append("post-LN blocks (BERT, the original Transformer) norm the residual after each write")
    if config.post_norms:
        reasons.append("post-norms (Gemma 2/3, OLMo 2) norm a sublayer's output as a whole, so one head's write "
                       "depends on the other heads'")
    if not config.pre_norms:
        reasons.append("the model has no pre-norms")
    if config.kv_rank:
        reasons.append("latent attention (DeepSeek) computes every head's keys and values from one shared latent")
    if config.cross_attention:
        reasons.append("cross-attention reads the encoder's output (edges of encoder-decoders are not built)")
    if config.head == "none":
        reasons.append("the model has no logits")
    if reasons:
        raise ResidError("Edge circuits need a residual stream that is a sum of pre-normed reads; here "
                         f"{'; '.join(reasons)}. Use node-level patching (resid.analyses.patching.activation) for "
                         "this model.")


@dataclass(frozen=True)
class EdgeGraph:
    """The writers, readers and edges of a model of `n_layers` layers of `n_heads` query and `n_kv_heads` key/value
    heads (see the module docstring); `parallel`: both sublayers of a block read resid_pre."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    parallel: bool

    @classmethod
    def of(cls, config: ModelConfig) -> "EdgeGraph":
        supported(config)
        return cls(config.n_layers, config.n_heads, config.n_kv_heads, config.block == "parallel")

    # --- nodes, in stream order ------------------------------------------------------------------------------------
    @cached_property
    def writers(self) -> tuple[Site, ...]:
        layers = [(*(Site(l, "attn", head=h) for h in range(self.n_heads)), Site(l, "mlp"))
                  for l in range(self.n_layers)]
        return (EMBED, *(site for layer in layers for site in layer))

    @cached_property
    def readers(self) -> tuple[Site, ...]:
        return (*(site for l in range(self.n_layers) for site in self.layer_readers(l)), LOGITS)

    def layer_readers(self, layer: int) -> tuple[Site, ...]:
        return (*(Site(layer, "attn", head=h, field="q") for h in range(self.n_heads)),
                *(Site(layer, "attn", kv_head=g, field=f) for f in ("k", "v") for g in range(self.n_kv_heads)),
                Site(layer, "mlp"))

    @property
    def per_layer_writers(self) -> int:
        return self.n_heads + 1

    @property
    def per_layer_readers(self) -> int:
        return self.n_heads + 2 * self.n_kv_heads + 1

    def writer_slice(self, layer: int, part: str) -> slice:
        """The columns of layer `layer`'s heads ("attn") or MLP ("mlp") among the writers."""
        start = 1 + layer * self.per_layer_writers
        return slice(start, start + self.n_heads) if part == "attn" else slice(start + self.n_heads,
                                                                               start + self.n_heads + 1)

    def reader_slice(self, layer: int | None, field: str) -> slice:
        """The columns of a layer's q, k or v readers or its MLP ("mlp"), or the logits (layer None)."""
        if layer is None:
            return slice(len(self.readers) - 1, len(self.readers))
        start = layer * self.per_layer_readers
        h, g = self.n_heads, self.n_kv_heads
        offsets = {"q": (0, h), "k": (h, h + g), "v": (h + g, h + 2 * g), "mlp": (h + 2 * g, h + 2 * g + 1)}
        a, b = offsets[field]
        return slice(start + a, start + b)

    def writers_before(self, layer: int | None, field: str) -> int:
        """How many writers (a prefix of `writers`) the reader group reads: everything of earlier layers, and for
        a sequential block's MLP its own layer's heads too; the logits read every writer."""
        if layer is None:
            return len(self.writers)
        seen = 1 + layer * self.per_layer_writers
        return seen + self.n_heads if field == "mlp" and not self.parallel else seen

    @cached_property
    def valid(self) -> Bool[Tensor, "writer reader"]:
        """True where (writer, reader) is an edge."""
        valid = torch.zeros(len(self.writers), len(self.readers), dtype=torch.bool)
        for layer in (*range(self.n_layers), None):
            for field in ("q", "k", "v", "mlp") if layer is not None else ("logits",):
                valid[: self.writers_before(layer, field), self.reader_slice(layer, field)] = True
        return valid

    @cached_property
    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """(writer index, reader index) of every edge, in reader-major stream order."""
        readers, writers = np.nonzero(self.valid.T.numpy())
        return writers, readers

    @property
    def n_edges(self) -> int:
        return len(self.edges[0])

    def edge_index(self, writer: Site, reader: Site) -> tuple[int, int]:
        """The (writer, reader) indices of an edge named by its Sites."""
        try:
            w, r = self.writers.index(writer), self.readers.index(reader)
        except ValueError:
            raise ResidError(f"({writer.label}, {reader.label}) is not an edge of this model: writers are embed, "
                             "layers[L].attn.head[H] and layers[L].mlp; readers layers[L].attn.head[H].q, "
                             "layers[L].attn.kv_head[G].k | .v, layers[L].mlp and logits.") from None
        if not bool(self.valid[w, r]):
            raise ResidError(f"{writer.label} does not write before {reader.label} reads: not an edge.")
        return w, r

    def empty(self) -> Bool[Tensor, "writer reader"]:
        return torch.zeros(len(self.writers), len(self.readers), dtype=torch.bool)

    def full(self) -> Bool[Tensor, "writer reader"]:
        return self.valid.clone()

    # --- nodes as sets of edges ------------------------------------------------------------------------------------
    def node_mask(self, nodes) -> Bool[Tensor, "writer reader"]:
        """The circuit of a set of nodes (heads `layers[l].attn.head[h]` and MLPs `layers[l].mlp`; the embeddings
        are always in): every edge out of a node of the set. A node outside it has every write patched, so what it
        reads cannot matter."""
        nodes = set(nodes) | {EMBED}
        known = set(self.writers)
        unknown = [site.label for site in nodes if site not in known]
        if unknown:
            raise ResidError(f"Not nodes of the edge graph: {', '.join(unknown[:5])}; name heads "
                             "layers[L].attn.head[H] and MLPs layers[L].mlp.")
        writes = torch.tensor([site in nodes for site in self.writers])
        return self.valid & writes[:, None]
