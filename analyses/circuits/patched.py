"""The edge-patched forward pass: each reader of the edge graph (resid.analyses.circuits.graph) reads its own input,

    input_r = resid_r + sum_w (1 - keep[w, r]) (reference_w - write_w) + probe_r

where resid_r is the residual the reader's sublayer reads in this pass (resid_pre, or resid_mid for a sequential
block's MLP, the final residual for the logits), write_w a writer's output in this pass and reference_w its output in
the reference run (the corrupt prompt, or a mean). With keep = 1 the pass is the model's own; with keep = 0 every
reader reads the reference run's input, so every node computes the reference run's output; a circuit keeps its
edges at 1. `probe` (zeros that require a gradient) gives d metric / d input_r of every reader from one backward pass
(EAP and EAP-IG, resid.analyses.circuits.eap).

Everything goes through the model's own forward and resid.Hook interventions on whole fields (no second copy of
the attention): the residual a sublayer reads is seen at resid_pre / resid_mid (and returned unchanged), writes at
a head's z (under post-norms at the attention's out, the whole normed write) and an MLP's out, and the inputs are
put in at a head's q_proj, k_proj and v (each query head's and each key/value head's own input through the pre-norm
and its projection) and at the MLP's normalized input. Latent attention's inputs are put in at its latents: the
key/value reader's at kv_latent (and the shared rotary key's dims of k_proj), a latent query reader's at q_proj.
Without pre-norms (OLMo 2) the MLP reads resid_mid itself: the pass puts the MLP's input there and takes the
difference back out of the MLP's write, so the stream after the block is the model's own. The pass's rows are
`circuits` blocks of the pairs' rows (circuit-major): keep is [circuit writer reader], the reference [pair ...] is
shared by the blocks.

Encoder-decoders (resid.analyses.circuits.seq2seq) run two passes, the encoder's and the decoder's, one each side of
the cross-attention: the encoder's final readers are every cross-attention's key/value heads, whose inputs it keeps
(`final_inputs`) at its last resid_post; the decoder's pass (`source`: the encoder's) puts each through the encoder's
final norm (`source_norm`) and the cross-attention's W_K / W_V at its k_proj and v, and its cross-attention heads
write and their queries read as self-attention's do.

Glossary: n the pairs of a batch, C the circuits run together, b = C * n the rows of the pass, W writers, R readers.
"""

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from resid.analyses.circuits.graph import LOGITS, EdgeGraph
from resid.capture import Capture
from resid.interventions import Hook
from resid.model import Transformer
from resid.sites import Site
from resid.tokenizer import Tokens


@dataclass(frozen=True)
class Writes:
    """Every writer's output in one run, as the run computed it: the embeddings' sum [n pos d_model], each layer's
    head mixes z [n pos head d_head] (a head writes z[h] @ W_O[h]) and MLP writes [n pos d_model]; under
    post-norms each layer's whole attention write `attn` [n pos d_model] instead of z (empty). A mean reference
    holds [1 1 ...] tensors."""

    embed: Float[Tensor, "n pos d_model"]
    z: tuple[Float[Tensor, "n pos head d_head"], ...]
    mlp: tuple[Float[Tensor, "n pos d_model"], ...]
    attn: tuple[Float[Tensor, "n pos d_model"], ...] = ()
    cross: tuple[Float[Tensor, "n pos head d_head"], ...] = ()  # a decoder's cross-attention heads' z

    @classmethod
    def of(cls, model: Transformer, tokens: Tokens) -> "Writes":
        """The writes of a plain run of `tokens` (no gradient)."""
        whole = model.config.post_norms  # the heads write together (resid.analyses.circuits.graph)
        with torch.no_grad():
            run = model.run(tokens, capture=Capture(attn={"out" if whole else "z"}, mlp={"out"},
                                                    final_norm_scale=False), logits_at="last")
        stream = run.stream
        attn = tuple(layer.attn.out if whole else layer.attn.z for layer in stream.layers)
        return cls(stream.resid_pre(0), () if whole else attn, tuple(layer.mlp.out for layer in stream.layers),
                   attn if whole else ())

    def mean(self, mask: Float[Tensor, "n pos"]) -> "Writes":
        """Mean ablation's reference: every write averaged over the real positions of every prompt."""
        weight = mask.to(self.embed.dtype)
        total = weight.sum()

        def average(t: Tensor) -> Tensor:
            w = weight.view(*weight.shape, *([1] * (t.dim() - 2)))
            return ((t * w).sum((0, 1)) / total)[None, None]

        return Writes(average(self.embed), tuple(map(average, self.z)), tuple(map(average, self.mlp)),
                      tuple(map(average, self.attn)), tuple(map(average, self.cross)))


class EdgePass:
    """The hooks of one edge-patched pass (see the module docstring). `keep` [circuit writer reader] or None (every
    edge kept: nothing is patched); `probe` [b pos reader d_model] or None; `embed` [b pos d_model] or None: what the
    embeddings write in this pass instead of the tokens' own (EAP-IG on the inputs)."""

    def __init__(self, model: Transformer, graph: EdgeGraph, reference: Writes | None,
                 keep: Float[Tensor, "circuit writer reader"] | None, probe: Tensor | None = None,
                 embed: Tensor | None = None):
        self.model, self.graph, self.reference, self.probe, self.embed = model, graph, reference, probe, embed
        self.patched = None if keep is None else (1 - keep.to(model.dtype))  # the weight of each term swapped
        self.circuits = 1 if keep is None else keep.shape[0]
        # what the swapped terms add to each reader's input so far, [b pos reader d_model]: each writer group's
        # (reference - write) is spread over every reader after it as soon as it is written, one einsum per group
        self.pending: Tensor | None = None
        self.resid: dict[str, Tensor] = {}
        self.seen: dict[str, list[Tensor]] = {"embed": [], "z": [], "mlp": [], "attn": [], "cross": []}  # writes()
        self.shift: Tensor | None = None  # without pre-norms: what the MLP's input adds to resid_mid (taken back)
        self.kv_read: Tensor | None = None  # latent attention: the key/value reader's normed input
        self.final_inputs: Tensor | None = None  # an encoder's pass: its final readers' inputs [b pos reader d_model]
        self.source: EdgePass | None = None  # a decoder's pass: the encoder's, and its final norm
        self.source_norm = None

    def writes(self) -> Writes:
        """The writes this pass computed (detached), once it has run: with nothing patched and no embeddings given,
        the run's own (EAP's clean writes, without a forward pass of their own)."""
        return Writes(self.seen["embed"][0], tuple(self.seen["z"]), tuple(self.seen["mlp"]), tuple(self.seen["attn"]),
                      tuple(self.seen["cross"]))

    def interventions(self) -> list[Hook]:
        hooks = [Hook(Site(0, "resid_pre"), self._embeddings)]
        graph, pre_norms = self.graph, self.model.config.pre_norms
        for layer in range(graph.n_layers):
            if graph.kv_latent:  # latent attention: one key/value reader (resid.components.latent)
                keys = [Hook(Site(layer, "attn", field="kv_latent"), self._latent_kv(layer)),
                        Hook(Site(layer, "attn", field="k_proj"), self._rotary_key(layer))]
            else:
                keys = [Hook(Site(layer, "attn", field="k_proj"), self._projection(layer, "k")),
                        Hook(Site(layer, "attn", field="v"), self._projection(layer, "v"))]
            hooks += [
                Hook(Site(layer, "resid_pre"), self._keep("attn")) if layer else None,
                Hook(Site(layer, "attn", field="q_proj"),
                     self._latent_query(layer) if graph.kv_latent else self._projection(layer, "q")),
                *keys,
                Hook(Site(layer, "attn", field="z"), self._heads(layer)) if graph.heads_write else
                Hook(Site(layer, "attn"), self._attn_write(layer)),
                *(self._cross_hooks(layer) if graph.cross else ()),
                None if graph.parallel else Hook(Site(layer, "resid_cross" if graph.cross else "resid_mid"),
                                                 self._keep("mlp") if pre_norms else self._mlp_resid(layer)),
                Hook(Site(layer, "mlp", field="normalized"), self._mlp_input(layer)) if pre_norms else None,
                Hook(Site(layer, "mlp", field="out"), self._mlp_write(layer)),
            ]
        last = Site(self.graph.n_layers - 1, "resid_post")
        hooks.append(Hook(last, self._logits if graph.final == (LOGITS,) else self._final_inputs))
        return [hook for hook in hooks if hook is not None]

    def _cross_hooks(self, layer: int) -> list[Hook]:
        """A decoder layer's cross-attention: it reads resid_mid (its queries), the encoder's output (its keys and
        values) and writes per head; the MLP then reads resid_cross."""
        return [Hook(Site(layer, "resid_mid"), self._keep("cross")),
                Hook(Site(layer, "cross", field="q_proj"), self._cross_query(layer)),
                Hook(Site(layer, "cross", field="k_proj"), self._cross_memory(layer, "k")),
                Hook(Site(layer, "cross", field="v"), self._cross_memory(layer, "v")),
                Hook(Site(layer, "cross", field="z"), self._heads(layer, "cross"))]

    # --- what the pass reads ---------------------------------------------------------------------------------------
    def _embeddings(self, resid: Tensor, tokens: Tokens) -> Tensor:
        resid = resid if self.embed is None else self.embed.to(resid.dtype)
        self.resid["attn"] = self.resid["mlp"] = resid
        self.seen["embed"].append(resid.detach())
        if self.patched is not None:
            self._spread(slice(0, 1), self._reference_minus(resid, self.reference.embed)[:, :, None])
        return resid

    def _keep(self, part: str):
        def seen(resid: Tensor, tokens: Tokens) -> Tensor:
            self.resid[part] = resid
            if part == "attn" and self.graph.parallel:
                self.resid["mlp"] = resid
            return resid
        return seen

    def _heads(self, layer: int, part: str = "attn"):
        """A layer's self-attention ("attn") or cross-attention ("cross") heads, each a writer."""
        field = "z" if part == "attn" else "cross"

        def seen(z: Tensor, tokens: Tokens) -> Tensor:
            self.seen[field].append(z.detach())
            if self.patched is not None:
                w_o = getattr(self.model.blocks[layer], part).W_O
                reference = getattr(self.reference, field)[layer]
                diff = torch.einsum("nphe,hed->nphd", self._reference_minus(z, reference), w_o)
                self._spread(self.graph.writer_slice(layer, part), diff)
            return z
        return seen

    def _attn_write(self, layer: int):
        """Under post-norms: the layer's whole attention write, one writer."""
        def seen(out: Tensor, tokens: Tokens) -> Tensor:
            self.seen["attn"].append(out.detach())
            if self.patched is not None:
                diff = self._reference_minus(out, self.reference.attn[layer])[:, :, None]
                self._spread(self.graph.writer_slice(layer, "attn"), diff)
            return out
        return seen

    def _mlp_write(self, layer: int):
        def seen(out: Tensor, tokens: Tokens) -> Tensor:
            self.seen["mlp"].append(out.detach())
            if self.patched is not None:
                diff = self._reference_minus(out, self.reference.mlp[layer])[:, :, None]
                self._spread(self.graph.writer_slice(layer, "mlp"), diff)
            if self.shift is not None:  # without pre-norms: resid_mid held the MLP's input; the stream goes on
                out, self.shift = out - self.shift.to(out.dtype), None  # from resid_mid + the write
            return out
        return seen

    def _reference_minus(self, write: Tensor, reference: Tensor) -> Tensor:
        """reference - write, the reference [n ...] (or a mean [1 1 ...]) shared by the circuit blocks of `write`."""
        blocks = write.view(self.circuits, -1, *write.shape[1:])
        return (reference.to(write.dtype)[None] - blocks).view(write.shape)

    # --- what the pass puts in -------------------------------------------------------------------------------------
    def _spread(self, writers: slice, diff: Float[Tensor, "b pos w d_model"]) -> None:
        """Add a writer group's swapped terms to the pending input of every reader that reads it (the readers from
        the first one after the group: the weights of earlier ones are those of non-edges, ignored)."""
        first = self._first_reader(writers.start)
        weight = self.patched[:, writers, first:]  # [C w r]
        blocks = diff.view(self.circuits, -1, *diff.shape[1:])
        term = torch.einsum("cnpwd,cwr->cnprd", blocks, weight).reshape(diff.shape[0], diff.shape[1], -1,
                                                                        diff.shape[-1])
        if self.pending is None:
            shape = (diff.shape[0], diff.shape[1], len(self.graph.readers), diff.shape[-1])
            self.pending = torch.zeros(shape, dtype=diff.dtype, device=diff.device)
        if torch.is_grad_enabled():  # out of place: autograd keeps what the earlier readers read
            self.pending = torch.cat([self.pending[:, :, :first], self.pending[:, :, first:] + term], dim=2)
        else:
            self.pending[:, :, first:] += term

    def _first_reader(self, writer: int) -> int:
        """The first reader that reads writer column `writer`."""
        return self.graph.first_reader(writer)

    def inputs(self, layer: int | None, field: str, resid: Float[Tensor, "b pos d_model"]) -> Tensor:
        """The inputs [b pos r d_model] of one group of readers (a layer's q, k, v or MLP; the logits, layer None)."""
        columns = self.graph.reader_slice(layer, field)
        out = resid[:, :, None]
        if self.pending is not None:
            out = out + self.pending[:, :, columns].to(out.dtype)
        if self.probe is not None:
            out = out + self.probe[:, :, columns].to(out.dtype)
        return out.expand(-1, -1, columns.stop - columns.start, -1)

    def _projection(self, layer: int, name: str):
        attention, norm = self.model.blocks[layer].attn, _pre_norm(self.model.blocks[layer].ln_attn)
        weight, bias = {"q": (attention.W_Q, attention.b_Q), "k": (attention.W_K, attention.b_K),
                        "v": (attention.W_V, attention.b_V)}[name]

        def put(projected: Tensor, tokens: Tokens) -> Tensor:
            if self.patched is None and self.probe is None:
                return projected
            normalized = norm.normalize(self.inputs(layer, name, self.resid["attn"]))
            out = torch.einsum("bphd,hde->bphe", normalized, weight)
            return (out if bias is None else out + bias).to(projected.dtype)
        return put

    def _latent_query(self, layer: int):
        """Latent attention's q_proj: each head's from its own reader's input (x W_Q[h]), or with a query latent
        every head's from the one query reader's (through W_DQ, the latent's norm and W_UQ)."""
        attention, norm = self.model.blocks[layer].attn, _pre_norm(self.model.blocks[layer].ln_attn)

        def put(projected: Tensor, tokens: Tokens) -> Tensor:
            if self.patched is None and self.probe is None:
                return projected
            read = norm.normalize(self.inputs(layer, "q", self.resid["attn"]))
            if not attention.q_rank:
                return torch.einsum("bphd,hde->bphe", read, attention.W_Q).to(projected.dtype)
            latent = attention.q_latent_norm.normalize(read[:, :, 0] @ attention.W_DQ)
            return torch.einsum("bpr,hre->bphe", latent, attention.W_UQ).to(projected.dtype)
        return put

    def _latent_kv(self, layer: int):
        """Latent attention's keys and values: kv_latent from the one key/value reader's input (through the
        pre-norm, W_DKV and the latent's norm); every head's k (its first dims) and v follow from it."""
        attention, norm = self.model.blocks[layer].attn, _pre_norm(self.model.blocks[layer].ln_attn)

        def put(latent: Tensor, tokens: Tokens) -> Tensor:
            if self.patched is None and self.probe is None:
                return latent
            self.kv_read = norm.normalize(self.inputs(layer, "kv", self.resid["attn"])[:, :, 0])
            return attention.kv_latent_norm.normalize(self.kv_read @ attention.W_DKV).to(latent.dtype)
        return put

    def _rotary_key(self, layer: int):
        """Latent attention's rotary key dims of k_proj (x W_KR, shared by the heads) from the same reader."""
        attention = self.model.blocks[layer].attn

        def put(k: Tensor, tokens: Tokens) -> Tensor:
            if self.patched is None and self.probe is None:
                return k
            rotary = (self.kv_read @ attention.W_KR).to(k.dtype)[:, :, None].expand(-1, -1, k.shape[2], -1)
            return torch.cat((k[..., : attention.nope], rotary), dim=-1)
        return put

    def _mlp_resid(self, layer: int):
        """Without pre-norms: the MLP reads resid_mid itself, so its input is put in there (its difference from
        resid_mid is taken back out of its write, `_mlp_write`)."""
        def put(resid: Tensor, tokens: Tokens) -> Tensor:
            self.resid["mlp"] = resid
            if self.patched is None and self.probe is None:
                return resid
            read = self.inputs(layer, "mlp", resid)[:, :, 0].to(resid.dtype)
            self.shift = read - resid
            return read
        return put

    def _cross_query(self, layer: int):
        """Each cross-attention head's q_proj from its own reader's input, through the cross pre-norm."""
        attention, norm = self.model.blocks[layer].cross, _pre_norm(self.model.blocks[layer].ln_cross)

        def put(projected: Tensor, tokens: Tokens) -> Tensor:
            if self.patched is None and self.probe is None:
                return projected
            out = torch.einsum("bphd,hde->bphe", norm.normalize(self.inputs(layer, "cross_q", self.resid["cross"])),
                               attention.W_Q)
            return (out if attention.b_Q is None else out + attention.b_Q).to(projected.dtype)
        return put

    def _cross_memory(self, layer: int, name: str):
        """Each cross-attention key/value head's k_proj or v from its own reader's input, which the encoder's pass
        kept: the encoder's final residual plus its swapped terms, through the encoder's final norm."""
        attention = self.model.blocks[layer].cross
        weight, bias = (attention.W_K, attention.b_K) if name == "k" else (attention.W_V, attention.b_V)
        g = self.graph.n_kv_heads
        start = (2 * layer + (name == "v")) * g  # the encoder's final readers: each layer's k heads, then v heads

        def put(projected: Tensor, tokens: Tokens) -> Tensor:
            if self.source is None or self.source.final_inputs is None:
                return projected
            read = self.source_norm(self.source.final_inputs[:, :, start:start + g])
            out = torch.einsum("bsgd,gde->bsge", read, weight)
            return (out if bias is None else out + bias).to(projected.dtype)
        return put

    def _final_inputs(self, resid: Tensor, tokens: Tokens) -> Tensor:
        """An encoder's last residual: kept as the inputs of its final readers (every cross-attention's keys and
        values), and passed on unchanged."""
        if self.patched is not None or self.probe is not None:
            self.final_inputs = self.inputs(None, "final", resid)
        return resid

    def _mlp_input(self, layer: int):
        norm = self.model.blocks[layer].ln_mlp

        def put(normalized: Tensor, tokens: Tokens) -> Tensor:
            if self.patched is None and self.probe is None:
                return normalized
            return norm.normalize(self.inputs(layer, "mlp", self.resid["mlp"])[:, :, 0]).to(normalized.dtype)
        return put

    def _logits(self, resid: Tensor, tokens: Tokens) -> Tensor:
        if self.patched is None and self.probe is None:
            return resid
        return self.inputs(None, "logits", resid)[:, :, 0].to(resid.dtype)


class _Unnormed:
    """The pre-norm of a model without pre-norms (OLMo 2): its readers read the residual itself."""

    @staticmethod
    def normalize(x: Tensor) -> Tensor:
        return x


def _pre_norm(norm):
    """A sublayer's pre-norm, or _Unnormed where it has none."""
    return _Unnormed if norm is None else norm


def repeat(tokens: Tokens, times: int) -> Tokens:
    """`tokens` stacked `times` times (the rows of `times` circuit blocks)."""
    if times == 1:
        return tokens
    return Tokens(*(t.repeat(times, 1) for t in (tokens.ids, tokens.attention_mask, tokens.position_ids)))


def patched_logits(model: Transformer, graph: EdgeGraph, tokens: Tokens, reference: Writes,
                   keep: Float[Tensor, "circuit writer reader"]) -> Float[Tensor, "circuit n d_vocab"]:
    """The last-token logits of `tokens` (the clean prompts, n rows) with every edge weighted by keep[c]: one
    forward of C * n rows."""
    circuits = keep.shape[0]
    edge_pass = EdgePass(model, graph, reference, keep.to(model.device))
    with torch.no_grad():
        run = model.run(repeat(tokens, circuits), capture=Capture.none(), interventions=edge_pass.interventions(),
                        logits_at="last")
    return run.logits[:, 0].view(circuits, -1, run.logits.shape[-1])
