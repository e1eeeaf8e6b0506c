"""The edge graph of an encoder-decoder model (resid.EncoderDecoder: T5, Flan-T5, umT5) and its edge-patched run.

Two stacks, each the graph of resid.analyses.circuits.graph: the encoder's (Sites "encoder.<label>": its embeddings,
heads and MLPs write, their q, k, v and MLP inputs read) and the decoder's (its self-attention heads, cross-attention
heads `layers[l].cross.head[h]` and MLPs write; its q, k, v, cross-attention queries `layers[l].cross.head[h].q`,
MLPs and the logits read). The edges between them are those of cross-attention: every encoder writer to every
cross-attention key/value head's k and v (`layers[l].cross.kv_head[g].k | .v`), which read the encoder's final
normed output; they are the encoder's final readers, as the logits are the decoder's. Writers and readers are the
encoder's then the decoder's, so a [writer reader] mask is block-diagonal.

A pair is (clean source, clean target prefix) and (corrupt source, corrupt target prefix), both of equal token
lengths (each side patched position for position). `side` below is the pair of Tokens (source, target) of one run.
Exact patching and the circuits' evaluation run here; EAP and EAP-IG are refused by name (`decoder_only`).
"""

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from resid.analyses.circuits.graph import EMBED, EdgeGraph, supported
from resid.analyses.circuits.patched import EdgePass, patched_logits, plain_writes, repeat
from resid.analyses.circuits.prefix import SharedPrefix
from resid.analyses.circuits.writes import Writes
from resid.capture import Capture
from resid.errors import ResidError
from resid.model import Transformer
from resid.seq2seq import EncoderDecoder
from resid.sites import Site
from resid.tokenizer import Tokens


@dataclass(frozen=True)
class Seq2SeqGraph:
    """The encoder's graph and the decoder's, joined by the cross-attention's key/value readers (see the module
    docstring). Offers the members of EdgeGraph that circuits, tables and evaluation read."""

    encoder: EdgeGraph
    decoder: EdgeGraph

    @classmethod
    def of(cls, model: EncoderDecoder) -> "Seq2SeqGraph":
        enc, dec = model.encoder.config, model.decoder.config
        for config in (enc, dec):
            supported(config, encoder_decoder=True)
        if dec.post_norms or dec.kv_rank or dec.block == "parallel":
            raise ResidError("Edge circuits of encoder-decoders take pre-norm, sequential stacks (T5, Flan-T5, "
                             "umT5); this model's decoder has post-norms, latent attention or parallel blocks.")
        cross = tuple(Site(l, "cross", kv_head=g, field=f) for l in range(dec.n_layers) for f in ("k", "v")
                      for g in range(dec.n_kv_heads))
        encoder = EdgeGraph(enc.n_layers, enc.n_heads, enc.n_kv_heads, enc.block == "parallel",
                            heads_write=not enc.post_norms, stack="encoder", final=cross)
        return cls(encoder, EdgeGraph(dec.n_layers, dec.n_heads, dec.n_kv_heads, False, cross=True))

    @cached_property
    def writers(self) -> tuple[Site, ...]:
        return (*self.encoder.writers, *self.decoder.writers)

    @cached_property
    def readers(self) -> tuple[Site, ...]:
        return (*self.encoder.readers, *self.decoder.readers)

    @cached_property
    def valid(self) -> Bool[Tensor, "writer reader"]:
        return torch.block_diag(self.encoder.valid, self.decoder.valid)

    @cached_property
    def feeds(self) -> Bool[Tensor, "reader writer"]:
        """EdgeGraph.feeds of both stacks; a cross-attention key/value head's k and v (the encoder's final readers)
        feed the query heads of its group."""
        feeds = torch.block_diag(self.encoder.feeds, self.decoder.feeds)
        w, first = len(self.encoder.writers), len(self.encoder.readers) - len(self.encoder.final)
        group = self.decoder.n_heads // self.decoder.n_kv_heads
        for i, site in enumerate(self.encoder.final):
            heads = self.decoder.writer_slice(site.layer, "cross")
            start = w + heads.start + site.kv_head * group
            feeds[first + i, start:start + group] = True
        return feeds

    def stages(self) -> list[tuple[slice, list[int]]]:
        """EdgeGraph.stages of the encoder, then of the decoder, whose cross-attention heads are fed by their
        queries and by their keys and values (the encoder's final readers)."""
        w, r = len(self.encoder.writers), len(self.encoder.readers)
        first = r - len(self.encoder.final)
        out = list(self.encoder.stages())
        for writers, columns in self.decoder.stages():
            site = self.decoder.writers[writers.start]
            extra = [first + i for i, s in enumerate(self.encoder.final) if s.layer == site.layer] if (
                site.part == "cross") else []
            out.append((slice(w + writers.start, w + writers.stop), [r + c for c in columns] + extra))
        return out

    @cached_property
    def edges(self) -> tuple[np.ndarray, np.ndarray]:
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
            raise ResidError(f"({writer.label}, {reader.label}) is not an edge of this model: writers are "
                             "encoder.embed, encoder.layers[L].attn.head[H], encoder.layers[L].mlp, embed, "
                             "layers[L].attn.head[H], layers[L].cross.head[H] and layers[L].mlp; readers their q, k, "
                             "v and MLP inputs, layers[L].cross.head[H].q, layers[L].cross.kv_head[G].k | .v (the "
                             "encoder's) and logits.") from None
        if not bool(self.valid[w, r]):
            raise ResidError(f"{writer.label} does not write before {reader.label} reads: not an edge.")
        return w, r

    def empty(self) -> Bool[Tensor, "writer reader"]:
        return torch.zeros(len(self.writers), len(self.readers), dtype=torch.bool)

    def full(self) -> Bool[Tensor, "writer reader"]:
        return self.valid.clone()

    def node_mask(self, nodes) -> Bool[Tensor, "writer reader"]:
        """Every edge out of a set of nodes (both stacks' embeddings always in; EdgeGraph.node_mask)."""
        nodes = set(nodes)
        encoder_embed = Site(None, "embed", stack="encoder")
        unknown = [site.label for site in nodes if site not in set(self.writers)]
        if unknown:
            raise ResidError(f"Not nodes of the edge graph: {', '.join(unknown[:5])}; name heads (layers[L].attn."
                             "head[H], layers[L].cross.head[H], encoder.layers[L].attn.head[H]) and MLPs.")
        writes = torch.tensor([site in nodes | {EMBED, encoder_embed} for site in self.writers])
        return self.valid & writes[:, None]


Model = Transformer | EncoderDecoder  # what the circuit functions take
Graph = EdgeGraph | Seq2SeqGraph


def graph_of(model: Model) -> Graph:
    """The edge graph of a decoder-only model or of an encoder-decoder model."""
    return Seq2SeqGraph.of(model) if isinstance(model, EncoderDecoder) else EdgeGraph.of(model.config)


def decoder_only(model, method: str) -> None:
    """Refuse `method` (EAP, EAP-IG) on an encoder-decoder model, saying what runs there."""
    if isinstance(model, EncoderDecoder):
        raise ResidError(f"{method} is not built for encoder-decoder models yet (its gradients would cross the "
                         "cross-attention): use circuits.exact, and circuits.evaluate / necessity_sufficiency for "
                         "circuits, with source= and corrupt_source=.")


# --- the runs: one side is Tokens (a decoder-only model) or (source, target) Tokens ------------------------------
def rows(side) -> int:
    """How many pairs a side holds."""
    return (side[1] if isinstance(side, tuple) else side).ids.shape[0]


def last_logits(model, side, prefix: SharedPrefix | None = None) -> Float[Tensor, "n d_vocab"]:
    """The plain run's last-token logits (no gradient); with a prefix, over the positions after it."""
    if prefix is not None:
        return prefix.last_logits(model, side)
    with torch.no_grad():
        run = model.run(*side, capture=Capture.none(), logits_at="last") if isinstance(side, tuple) else (
            model.run(side, capture=Capture.none(), logits_at="last"))
    return run.logits[:, 0]


def writes_of(model, side, reference: str = "corrupt", prefix: SharedPrefix | None = None):
    """The writes of a plain run of `side` (Writes; an encoder-decoder's: (encoder's, decoder's), the decoder's with
    the run's last-token logits), or with reference "mean" their means over the real positions; with a prefix (a
    decoder's, corrupt reference), at the positions after it."""
    if not isinstance(side, tuple):
        writes = plain_writes(model, side, prefix)
    else:
        source, target = side
        plain = dict(attn={"z"}, mlp={"out"}, final_norm_scale=False)
        with torch.no_grad():
            run = model.run(source, target, capture=Capture(**plain, cross={"z"}), encoder_capture=Capture(**plain),
                            logits_at="last")
        encoder, decoder = run.encoder.stream, run.stream
        writes = (Writes(encoder.resid_pre(0), tuple(l.attn.z for l in encoder.layers),
                         tuple(l.mlp.out for l in encoder.layers)),
                  Writes(decoder.resid_pre(0), tuple(l.attn.z for l in decoder.layers),
                         tuple(l.mlp.out for l in decoder.layers), cross=tuple(l.cross.z for l in decoder.layers),
                         logits=run.logits[:, 0]))
    return mean_writes(side, writes) if reference == "mean" else writes


def mean_writes(side, writes):
    """Mean ablation's reference from the writes of `side` (writes_of's): each stack's over its real positions."""
    if not isinstance(side, tuple):
        return writes.mean(side.attention_mask)
    return writes[0].mean(side[0].attention_mask), writes[1].mean(side[1].attention_mask)


def logits_with(model, graph, side, reference, keep: Float[Tensor, "circuit writer reader"],
                prefix: SharedPrefix | None = None) -> Float[Tensor, "circuit n d_vocab"]:
    """The last-token logits of `side` (the clean runs) with every edge weighted by keep[c]: one forward of C * n
    rows (resid.analyses.circuits.patched; with a prefix, a decoder's, over the positions after it)."""
    if not isinstance(side, tuple):
        return patched_logits(model, graph, side, reference, keep, prefix)
    circuits = keep.shape[0]
    keep = keep.to(model.device)
    w, r = len(graph.encoder.writers), len(graph.encoder.readers)
    encoder = EdgePass(model.encoder, graph.encoder, reference[0], keep[:, :w, :r])
    decoder = EdgePass(model.decoder, graph.decoder, reference[1], keep[:, w:, r:])
    decoder.source, decoder.source_norm = encoder, lambda x: model.encoder.readout.normalize(x)[0]
    source, target = (repeat(t, circuits) for t in side)
    with torch.no_grad():
        run = model.run(source, target, capture=Capture.none(), interventions=decoder.interventions(),
                        encoder_interventions=encoder.interventions(), logits_at="last")
    return run.logits[:, 0].view(circuits, -1, run.logits.shape[-1])


def decoder(model) -> Transformer:
    """The model whose prediction is measured: an encoder-decoder's decoder, or the model."""
    return model.decoder if isinstance(model, EncoderDecoder) else model


def source_tokens(ids: list, rows_: list[int], pad: int, device) -> Tokens:
    """The sources of these pairs, padded, on the device."""
    return Tokens.pad([ids[i] for i in rows_], pad).to(device)
