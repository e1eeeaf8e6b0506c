"""The edge graph of a model: who writes into the residual stream, who reads from it, and which writes each reader
sees (Syed et al. 2023; Hanna et al. 2024). Every node is a resid.Site and every edge a pair of them.

Glossary:
    writer   a node whose output is added to the stream: the embeddings (`embed`, every embedding write together),
             each query head h of layer l (`layers[l].attn.head[h]`, its write z[h] @ W_O[h]), each MLP
             (`layers[l].mlp`, the whole sublayer, a mixture of experts included). With post-norms (Gemma 2/3,
             OLMo 2) a layer's attention output is normed as a whole before it is written, so one head's write
             depends on the others': the attention is one writer there (`layers[l].attn`), as the MLP is
    reader   a node whose input is read from the stream: each query head's q (`layers[l].attn.head[h].q`), each
             key/value head's k and v (`layers[l].attn.kv_head[g].k | .v`: under GQA and MQA shared by its query
             heads, one reader, never one per query head), each MLP, and the logits (`logits`). Latent attention
             (DeepSeek's MLA) computes every head's keys and values from one latent of the layer's normed input:
             one reader per layer (`layers[l].attn.kv_latent`, its rotary key included), and where the queries
             come from a latent too (config.q_rank) one query reader (`layers[l].attn.q`)
    edge     (writer, reader) with the writer before the reader: a reader's input is the sum of the writes before
             it (plus constants), so an edge is one term of that sum, and patching it swaps that one term
    keep     [writer reader] (or [circuit writer reader]) weights of the terms: 1 keeps the edge's value of the
             running pass, 0 puts the corrupt (or mean) value in its place; fractions interpolate (EAP-IG on the
             activations); the entries of non-edges are ignored

A sequential block's heads read resid_pre and its MLP resid_mid (so the MLP reads the heads of its own layer);
a parallel block's heads and MLP both read resid_pre. Without pre-norms (OLMo 2) a reader reads the residual itself.
Models whose stream is not a sum of writes (post-LN: BERT norms the residual after each write) and models without
logits are refused with the reason (`supported`). Encoder-decoders join two of these graphs by their cross-attention
(resid.analyses.circuits.seq2seq).
"""

import dataclasses
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


def supported(config: ModelConfig, encoder_decoder: bool = False) -> None:
    """Refuse, by name, what the edge graph cannot split into a sum of writes (`encoder_decoder`: a stack of a
    resid.EncoderDecoder, whose encoder has no logits and whose decoder reads it by cross-attention)."""
    reasons = []
    if config.post_ln:
        reasons.append("post-LN blocks (BERT, the original Transformer) norm the residual after each write")
    if not config.pre_norms and config.block == "parallel":
        reasons.append("a parallel block without pre-norms has no input of its MLP apart from its attention's")
    if config.cross_attention and not encoder_decoder:
        reasons.append("cross-attention reads an encoder's output (pass the whole resid.EncoderDecoder, with source= "
                       "and corrupt_source=: resid.analyses.circuits.seq2seq)")
    if config.head == "none" and not encoder_decoder:
        reasons.append("the model has no logits")
    if reasons:
        raise ResidError("Edge circuits need a residual stream that is a sum of writes; here "
                         f"{'; '.join(reasons)}. Use node-level patching (resid.analyses.patching.activation) for "
                         "this model.")


@dataclass(frozen=True)
class EdgeGraph:
    """The writers, readers and edges of a model of `n_layers` layers of `n_heads` query and `n_kv_heads` key/value
    heads (see the module docstring); `parallel`: both sublayers of a block read resid_pre; `heads_write`: each
    head is a writer (False: the layer's attention is one, under post-norms); `kv_latent`: one key/value reader
    per layer (latent attention); `q_latent`: one query reader per layer (latent queries)."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    parallel: bool
    heads_write: bool = True
    kv_latent: bool = False
    q_latent: bool = False
    cross: bool = False  # a decoder's cross-attention: its heads write, their queries read
    stack: str | None = None  # the Sites' stack: "encoder" for an encoder-decoder model's encoder
    final: tuple[Site, ...] = (LOGITS,)  # the readers after the last layer (an encoder's: every cross k and v)

    @classmethod
    def of(cls, config: ModelConfig) -> "EdgeGraph":
        supported(config)
        return cls(config.n_layers, config.n_heads, config.n_kv_heads, config.block == "parallel",
                   heads_write=not config.post_norms, kv_latent=bool(config.kv_rank),
                   q_latent=bool(config.kv_rank and config.q_rank))

    # --- nodes, in stream order ------------------------------------------------------------------------------------
    @cached_property
    def writers(self) -> tuple[Site, ...]:
        cross = lambda l: tuple(Site(l, "cross", head=h) for h in range(self.n_heads)) if self.cross else ()  # noqa: E731
        layers = [(*self._attn_writers(l), *cross(l), Site(l, "mlp")) for l in range(self.n_layers)]
        return self._on_stack((EMBED, *(site for layer in layers for site in layer)))

    def _attn_writers(self, layer: int) -> tuple[Site, ...]:
        if not self.heads_write:
            return (Site(layer, "attn"),)
        return tuple(Site(layer, "attn", head=h) for h in range(self.n_heads))

    def _on_stack(self, sites: tuple[Site, ...]) -> tuple[Site, ...]:
        return sites if self.stack is None else tuple(dataclasses.replace(s, stack=self.stack) for s in sites)

    @cached_property
    def readers(self) -> tuple[Site, ...]:
        layers = self._on_stack(tuple(site for l in range(self.n_layers) for site in self.layer_readers(l)))
        return (*layers, *self.final)

    @property
    def attn_fields(self) -> tuple[str, ...]:
        """The reader groups of a layer's attention, in order: ("q", "k", "v"), or ("q", "kv") (latent)."""
        return ("q", "kv") if self.kv_latent else ("q", "k", "v")

    def attn_readers(self, layer: int) -> slice:
        """The columns of a layer's attention readers (its q, k and v, or q and kv, groups: contiguous)."""
        fields = self.attn_fields
        return slice(self.reader_slice(layer, fields[0]).start, self.reader_slice(layer, fields[-1]).stop)

    @cached_property
    def _groups(self) -> dict[str, tuple[int, int]]:
        """Each reader group of a layer: (offset among the layer's readers, count)."""
        counts = {"q": 1 if self.q_latent else self.n_heads, **({"kv": 1} if self.kv_latent else
                                                                 {"k": self.n_kv_heads, "v": self.n_kv_heads}),
                  **({"cross_q": self.n_heads} if self.cross else {}), "mlp": 1}
        offsets = np.cumsum([0, *counts.values()])
        return {field: (int(offset), count) for (field, count), offset in zip(counts.items(), offsets)}

    def layer_readers(self, layer: int) -> tuple[Site, ...]:
        q = (Site(layer, "attn", field="q"),) if self.q_latent else tuple(
            Site(layer, "attn", head=h, field="q") for h in range(self.n_heads))
        kv = (Site(layer, "attn", field="kv_latent"),) if self.kv_latent else tuple(
            Site(layer, "attn", kv_head=g, field=f) for f in ("k", "v") for g in range(self.n_kv_heads))
        cross = tuple(Site(layer, "cross", head=h, field="q") for h in range(self.n_heads)) if self.cross else ()
        return (*q, *kv, *cross, Site(layer, "mlp"))

    @property
    def attn_writers(self) -> int:
        """How many writers a layer's attention is: its heads, or one under post-norms."""
        return self.n_heads if self.heads_write else 1

    @property
    def cross_writers(self) -> int:
        """How many writers a layer's cross-attention is: its heads, or none."""
        return self.n_heads if self.cross else 0

    @property
    def per_layer_writers(self) -> int:
        return self.attn_writers + self.cross_writers + 1

    @property
    def per_layer_readers(self) -> int:
        return sum(count for _, count in self._groups.values())

    def writer_slice(self, layer: int, part: str) -> slice:
        """The columns of layer `layer`'s heads (or whole attention) ("attn"), cross-attention heads ("cross") or
        MLP ("mlp") among the writers."""
        start = 1 + layer * self.per_layer_writers
        a, c = self.attn_writers, self.cross_writers
        return {"attn": slice(start, start + a), "cross": slice(start + a, start + a + c),
                "mlp": slice(start + a + c, start + a + c + 1)}[part]

    def reader_slice(self, layer: int | None, field: str) -> slice:
        """The columns of a layer's q, k, v (or latent kv) readers or its MLP ("mlp"), or the logits (layer
        None)."""
        if layer is None:
            return slice(len(self.readers) - len(self.final), len(self.readers))
        if field not in self._groups:
            raise ResidError(f"This model's readers of a layer are {', '.join(self._groups)}; got {field!r}.")
        offset, count = self._groups[field]
        start = layer * self.per_layer_readers + offset
        return slice(start, start + count)

    def writers_before(self, layer: int | None, field: str) -> int:
        """How many writers (a prefix of `writers`) the reader group reads: everything of earlier layers, for a
        sequential block's MLP its own layer's attention (and cross-attention) too, for a cross-attention's queries
        its layer's self-attention; the logits read every writer."""
        if layer is None:
            return len(self.writers)
        seen = 1 + layer * self.per_layer_writers
        if field == "cross_q":
            return seen + self.attn_writers
        return seen + self.attn_writers + self.cross_writers if field == "mlp" and not self.parallel else seen

    def fed(self, reader: Site) -> slice:
        """The writer columns whose node a reader's input feeds: its head (or every head its key/value head or
        latent serves, or the whole attention under post-norms), its MLP; the logits feed none."""
        if reader in self.final:
            return slice(0, 0)
        if reader.part == "mlp":
            return self.writer_slice(reader.layer, "mlp")
        if reader.part == "cross":
            start = self.writer_slice(reader.layer, "cross").start
            return slice(start + reader.head, start + reader.head + 1)
        heads = self.writer_slice(reader.layer, "attn")
        if not self.heads_write or reader.field == "kv_latent" or (reader.field == "q" and reader.head is None):
            return heads
        if reader.field == "q":
            return slice(heads.start + reader.head, heads.start + reader.head + 1)
        group = self.n_heads // self.n_kv_heads
        return slice(heads.start + reader.kv_head * group, heads.start + (reader.kv_head + 1) * group)

    @cached_property
    def feeds(self) -> Bool[Tensor, "reader writer"]:
        """True where a reader's input feeds a writer node (`fed`)."""
        feeds = torch.zeros(len(self.readers), len(self.writers), dtype=torch.bool)
        for r, site in enumerate(self.readers):
            feeds[r, self.fed(site)] = True
        return feeds

    def stages(self) -> list[tuple[slice, list[int]]]:
        """The writer nodes in stream order, by groups: (their writer columns, the reader columns that feed them),
        a layer's attention, cross-attention and MLP (what pruning walks, resid.analyses.circuits.selection)."""
        def columns(layer: int, fields) -> list[int]:
            return [c for f in fields for c in range(self.reader_slice(layer, f).start,
                                                     self.reader_slice(layer, f).stop)]
        out = []
        for layer in range(self.n_layers):
            out.append((self.writer_slice(layer, "attn"), columns(layer, self.attn_fields)))
            if self.cross:
                out.append((self.writer_slice(layer, "cross"), columns(layer, ("cross_q",))))
            out.append((self.writer_slice(layer, "mlp"), columns(layer, ("mlp",))))
        return out

    @cached_property
    def valid(self) -> Bool[Tensor, "writer reader"]:
        """True where (writer, reader) is an edge."""
        valid = torch.zeros(len(self.writers), len(self.readers), dtype=torch.bool)
        for layer in (*range(self.n_layers), None):
            for field in self._groups if layer is not None else ("final",):
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

    def _names(self) -> str:
        """The node names of this graph, for messages."""
        head = "layers[L].attn.head[H]" if self.heads_write else "layers[L].attn (post-norms: the heads write " \
            "together)"
        q = "layers[L].attn.q" if self.q_latent else "layers[L].attn.head[H].q"
        kv = "layers[L].attn.kv_latent" if self.kv_latent else "layers[L].attn.kv_head[G].k | .v"
        return f"writers are embed, {head} and layers[L].mlp; readers {q}, {kv}, layers[L].mlp and logits"

    def edge_index(self, writer: Site, reader: Site) -> tuple[int, int]:
        """The (writer, reader) indices of an edge named by its Sites."""
        try:
            w, r = self.writers.index(writer), self.readers.index(reader)
        except ValueError:
            raise ResidError(f"({writer.label}, {reader.label}) is not an edge of this model: "
                             f"{self._names()}.") from None
        if not bool(self.valid[w, r]):
            raise ResidError(f"{writer.label} does not write before {reader.label} reads: not an edge.")
        return w, r

    def empty(self) -> Bool[Tensor, "writer reader"]:
        return torch.zeros(len(self.writers), len(self.readers), dtype=torch.bool)

    def full(self) -> Bool[Tensor, "writer reader"]:
        return self.valid.clone()

    # --- nodes as sets of edges ------------------------------------------------------------------------------------
    def node_mask(self, nodes) -> Bool[Tensor, "writer reader"]:
        """The circuit of a set of nodes (heads `layers[l].attn.head[h]`, or under post-norms whole attentions
        `layers[l].attn`, and MLPs `layers[l].mlp`; the embeddings are always in): every edge out of a node of the
        set. A node outside it has every write patched, so what it reads cannot matter."""
        nodes = set(nodes) | {EMBED}
        known = set(self.writers)
        unknown = [site.label for site in nodes if site not in known]
        if unknown:
            whole = "" if self.heads_write else (" (post-norms norm the heads' writes together, so a layer's "
                                                 "attention is one node: no head-level node sets)")
            raise ResidError(f"Not nodes of the edge graph: {', '.join(unknown[:5])}; {self._names()}{whole}.")
        writes = torch.tensor([site in nodes for site in self.writers])
        return self.valid & writes[:, None]
