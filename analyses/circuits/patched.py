"""The edge-patched forward pass: each reader of the edge graph (resid.analyses.circuits.graph) reads its own input,

    input_r = resid_r + sum_w (1 - keep[w, r]) (reference_w - write_w) + probe_r

where resid_r is the residual the reader's sublayer reads in this pass (resid_pre, or resid_mid for a sequential
block's MLP, the final residual for the logits), write_w a writer's output in this pass and reference_w its output in
the reference run (the corrupt prompt, or a mean). With keep = 1 the pass is the model's own; with keep = 0 every
reader reads the reference run's input, so every node computes the reference run's output; a circuit keeps its
edges at 1. `probe` (zeros that require a gradient) gives d metric / d input_r of every reader from one backward pass
(EAP-IG on the activations, and EAP where taps do not apply: resid.analyses.circuits.eap).

With nothing patched (`keep` None: EAP, EAP-IG on the inputs) every reader's input is the residual its sublayer
reads, so the pass is the model's own forward and `taps` gives the same gradients without a probe: the backward pass
stops at each reader group's own tensor (a head's q_proj, a key/value head's k_proj and v, the MLP's normalized
input, the final residual), and `input_gradients` pushes those back through W_Q[h], W_K[g] and W_V[g] and the
pre-norm's Jacobian at the layer's residual, every head of a layer in one batched vector-Jacobian product of the
norm's own forward. Taps need every reader to be a plain pre-norm projection (`tappable`): latent attention, models
without pre-norms and encoder-decoders take the probe.

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

import dataclasses

import torch
from jaxtyping import Float
from torch import Tensor

from resid.analyses.circuits.graph import LOGITS, EdgeGraph
from resid.analyses.circuits.prefix import SharedPrefix
from resid.analyses.circuits.terms import Terms
from resid.analyses.circuits.writes import Writes
from resid.capture import Capture
from resid.errors import ResidError
from resid.interventions import Hook, Intervention, Replace
from resid.model import Transformer
from resid.sites import Site
from resid.tokenizer import Tokens


class EdgePass:
    """The hooks of one edge-patched pass (see the module docstring). `keep` [circuit writer reader] or None (every
    edge kept: nothing is patched); `probe` [b pos reader d_model] or None; `embed` [b pos d_model] or None: what the
    embeddings write in this pass instead of the tokens' own (EAP-IG on the inputs).

    A patched pass sums whichever of the two equal forms has fewer terms, chosen once from keep before the forward
    (the only time it asks the host for values):

        input_r = resid_r + sum_w (1 - keep[w, r]) (reference_w - write_w)          (large circuits)
                = reference_read_r + sum_w keep[w, r] (write_w - reference_w)       (small circuits)

    (the residual is the sum of the writes plus constants, the same in both runs; the second form only where the
    reference holds its reads, Writes.reads, and there is no probe). The terms' differences are kept and gathered
    by resid.analyses.circuits.terms (only the writers with a term; into reader-major inputs [r b pos d_model] that
    each head's projection takes as they are). A reader group without a term reads the pass's own residual (first
    form: the model's own projections) or the reference's (second form: for a pre-norm projection, one norm and
    projection of its n rows, for every circuit).

    In the second form, where the reference is a run (Writes.computed), a node none of whose inputs has a term
    computes the reference's write (terms.live), and a sublayer none of whose readers has a live term is not
    computed at all: the pass puts the reference's write in (a Replace of the whole write, which the model's
    forward does not compute). A small circuit's pass    then costs the sublayers it touches."""

    def __init__(self, model: Transformer, graph: EdgeGraph, reference: Writes | None,
                 keep: Float[Tensor, "circuit writer reader"] | None, probe: Tensor | None = None,
                 embed: Tensor | None = None, taps: bool = False):
        """`taps`: record what every reader group's input goes into, for taps.input_gradients (only where nothing is
        patched or probed, and the graph is `tappable`)."""
        if taps and (keep is not None or probe is not None or not tappable(model, graph)):
            raise ResidError("Taps need an unpatched pass without a probe of a model whose readers are all pre-norm "
                             "projections (circuits.patched.tappable); pass a zero probe instead.")
        self.model, self.graph, self.reference, self.probe, self.embed = model, graph, reference, probe, embed
        # with taps: what each reader group's input went into, in stream order ((layer, field, resid read, tensor);
        # layer None: the logits), for input_gradients
        self.taps: list[tuple[int | None, str, Tensor, Tensor]] | None = [] if taps else None
        self.patched = keep is not None
        self.circuits = 1 if keep is None else keep.shape[0]
        self.from_reference = False  # the second form (the class docstring)
        self.terms: Terms | None = None  # a patched pass's (_plan)
        if keep is not None:
            self._plan(keep)
        self.resid: dict[str, Tensor] = {}
        # this pass's writes and (where nothing is patched) reads, for `writes()`
        self.seen: dict[str, list[Tensor]] = {"embed": [], "z": [], "mlp": [], "attn": [], "cross": [],
                                              "attn_read": [], "mlp_read": [], "final": []}
        self.shift: Tensor | None = None  # without pre-norms: what the MLP's input adds to resid_mid (taken back)
        self.kv_read: Tensor | None = None  # latent attention: the key/value reader's normed input
        self.final_inputs: Tensor | None = None  # an encoder's pass: its final readers' inputs [reader b pos d_model]
        self.source: EdgePass | None = None  # a decoder's pass: the encoder's, and its final norm
        self.source_norm = None

    def _plan(self, keep: Tensor) -> None:
        """The form and the pass's terms (from one copy of keep on the host)."""
        valid = self.graph.valid.numpy()
        host = keep.detach().cpu().numpy()
        kept, patched = int(((host != 0) & valid).sum()), int(((host != 1) & valid).sum())
        self.from_reference = (kept < patched and self.probe is None and self.reference is not None
                               and self.reference.reads)
        self.terms = Terms(self.graph, host, keep.to(self.model.device, self.model.dtype), self.from_reference,
                           self.reference is not None and self.reference.computed)

    def writes(self) -> Writes:
        """The writes (and reads) this pass computed (detached), once it has run: with nothing patched and no
        embeddings given, the run's own (EAP's clean writes, without a forward pass of their own)."""
        seen = self.seen
        return Writes(seen["embed"][0], tuple(seen["z"]), tuple(seen["mlp"]), tuple(seen["attn"]),
                      tuple(seen["cross"]), tuple(seen["attn_read"]), tuple(seen["mlp_read"]),
                      seen["final"][0] if seen["final"] else None)

    def _skips(self, layer: int, part: str) -> bool:
        """Whether the pass puts the reference's write of a layer's attention or MLP in without computing it (the
        second form, where none of the sublayer's readers has a term and the reference is a run: it would compute
        the reference's write)."""
        if not (self.from_reference and self.reference.computed) or (part == "attn" and not self.reference.attn):
            return False
        readers = self.graph.attn_readers(layer) if part == "attn" else self.graph.reader_slice(layer, "mlp")
        return not self.terms.any(readers)

    def _reference_write(self, layer: int, part: str) -> Tensor:
        """The reference's write of a layer's attention or MLP, for every circuit block: [b pos d_model] (a mean's
        [1 1 d_model])."""
        write = (self.reference.attn if part == "attn" else self.reference.mlp)[layer]
        return write if write.shape[0] == 1 else write.repeat(self.circuits, 1, 1)

    def interventions(self) -> list[Intervention]:
        hooks = [Hook(Site(0, "resid_pre"), self._embeddings)]
        graph, pre_norms = self.graph, self.model.config.pre_norms
        for layer in range(graph.n_layers):
            attention = [Replace(Site(layer, "attn"), self._reference_write(layer, "attn"))] if self._skips(
                layer, "attn") else self._attention_hooks(layer)
            skip_mlp = self._skips(layer, "mlp")
            mid = self._keep("mlp") if pre_norms or skip_mlp else self._mlp_resid(layer)
            hooks += [
                Hook(Site(layer, "resid_pre"), self._keep("attn")) if layer else None,
                *attention,
                *(self._cross_hooks(layer) if graph.cross else ()),
                None if graph.parallel else Hook(Site(layer, "resid_cross" if graph.cross else "resid_mid"), mid),
                *([Replace(Site(layer, "mlp"), self._reference_write(layer, "mlp"))] if skip_mlp else [
                    Hook(Site(layer, "mlp", field="normalized"), self._mlp_input(layer)) if pre_norms else None,
                    Hook(Site(layer, "mlp", field="out"), self._mlp_write(layer))]),
            ]
        last = Site(self.graph.n_layers - 1, "resid_post")
        hooks.append(Hook(last, self._logits if graph.final == (LOGITS,) else self._final_inputs))
        return [hook for hook in hooks if hook is not None]

    def _attention_hooks(self, layer: int) -> list[Hook | None]:
        """A layer's attention: each reader's input put in at its projection, each head's write seen at z (under
        post-norms the whole write); where nothing is patched the whole write seen too (Writes.attn)."""
        graph = self.graph
        if graph.kv_latent:  # latent attention: one key/value reader (resid.components.latent)
            keys = [Hook(Site(layer, "attn", field="kv_latent"), self._latent_kv(layer)),
                    Hook(Site(layer, "attn", field="k_proj"), self._rotary_key(layer))]
        else:
            keys = [Hook(Site(layer, "attn", field="k_proj"), self._projection(layer, "k")),
                    Hook(Site(layer, "attn", field="v"), self._projection(layer, "v"))]
        return [Hook(Site(layer, "attn", field="q_proj"),
                     self._latent_query(layer) if graph.kv_latent else self._projection(layer, "q")),
                *keys,
                Hook(Site(layer, "attn", field="z"), self._heads(layer)) if graph.heads_write else
                Hook(Site(layer, "attn"), self._attn_write(layer)),
                Hook(Site(layer, "attn"), self._attn_out) if graph.heads_write and not self.patched else None]

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
        if self.patched and self.terms.spreads(slice(0, 1)):
            self.terms.spread(slice(0, 1), self._difference(resid, self.reference.embed)[:, :, None])
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
            heads = self.graph.writer_slice(layer, part)
            if self.patched and self.terms.spreads(heads):
                w_o = getattr(self.model.blocks[layer], part).W_O
                reference = getattr(self.reference, field)[layer]
                diff = torch.einsum("nphe,hed->nphd", self._difference(z, reference), w_o)
                self.terms.spread(heads, diff)
            return z
        return seen

    def _attn_write(self, layer: int):
        """Under post-norms: the layer's whole attention write, one writer."""
        def seen(out: Tensor, tokens: Tokens) -> Tensor:
            self.seen["attn"].append(out.detach())
            whole = self.graph.writer_slice(layer, "attn")
            if self.patched and self.terms.spreads(whole):
                self.terms.spread(whole, self._difference(out, self.reference.attn[layer])[:, :, None])
            return out
        return seen

    def _attn_out(self, out: Tensor, tokens: Tokens) -> Tensor:
        self.seen["attn"].append(out.detach())
        return out

    def _mlp_write(self, layer: int):
        def seen(out: Tensor, tokens: Tokens) -> Tensor:
            self.seen["mlp"].append(out.detach())
            mlp = self.graph.writer_slice(layer, "mlp")
            if self.patched and self.terms.spreads(mlp):
                self.terms.spread(mlp, self._difference(out, self.reference.mlp[layer])[:, :, None])
            if self.shift is not None:  # without pre-norms: resid_mid held the MLP's input; the stream goes on
                out, self.shift = out - self.shift.to(out.dtype), None  # from resid_mid + the write
            return out
        return seen

    def _difference(self, write: Tensor, reference: Tensor) -> Tensor:
        """reference - write (first form) or write - reference (second form), the reference [n ...] (or a mean
        [1 1 ...]) shared by the circuit blocks of `write`."""
        blocks = write.view(self.circuits, -1, *write.shape[1:])
        diff = reference.to(write.dtype)[None] - blocks
        return (-diff if self.from_reference else diff).view(write.shape)

    def _reference_read(self, layer: int | None, field: str, like: Tensor) -> Tensor:
        """What the reader group reads in the reference run, as `like`'s rows [b pos d_model] (every circuit block
        the reference's)."""
        return self._over_circuits(self.reference.read(layer, field).to(like.dtype), like)

    def _over_circuits(self, t: Tensor, like: Tensor) -> Tensor:
        """`t` (the reference's rows [n ...], or a mean's [1 1 ...]) for every circuit block of `like` [b ...]."""
        blocks = like.view(self.circuits, -1, *like.shape[1:])
        return t[None].expand_as(blocks).reshape(like.shape)

    # --- what the pass puts in -------------------------------------------------------------------------------------
    def _base(self, layer: int | None, field: str, resid: Tensor) -> Tensor:
        """What a reader group's input adds its terms to: the pass's residual (first form) or the reference's."""
        return self._reference_read(layer, field, resid) if self.from_reference else resid

    def _own(self, layer: int | None, field: str) -> bool:
        """Whether every reader of the group reads the same base, unchanged (no term in any circuit, no probe)."""
        if self.probe is not None:
            return False
        if not self.patched:
            return True
        return not self.terms.any(self.graph.reader_slice(layer, field))

    def inputs(self, layer: int | None, field: str, resid: Float[Tensor, "b pos d_model"]) -> Tensor:
        """The inputs [r b pos d_model] of one group of readers (a layer's q, k, v or MLP; the logits, layer None),
        reader-major: a head's projection is then one batched product over the heads."""
        columns = self.graph.reader_slice(layer, field)
        out = self._base(layer, field, resid)[None]
        terms = self.terms.of(layer, field) if self.patched else None
        if terms is not None:
            out = out + terms.to(out.dtype)
        if self.probe is not None:
            out = out + self.probe[:, :, columns].to(out.dtype).permute(2, 0, 1, 3)
        return out.expand(columns.stop - columns.start, -1, -1, -1)

    def _unchanged(self, layer: int | None, field: str) -> bool:
        """Whether the reader group reads this pass's own residual unchanged (first form, no term, no probe): its
        hook returns the model's own tensor. The one rule every reader hook asks."""
        return self._own(layer, field) and not self.from_reference

    def _read(self, key: str, resid: Tensor) -> None:
        """Keep what a reader group reads ("attn_read", "mlp_read", "final") where nothing is patched (Writes)."""
        if not self.patched:
            self.seen[key].append(resid.detach())

    def _projection(self, layer: int, name: str):
        """A pre-norm projection's readers (each query head's q, each key/value head's k and v)."""
        attention, norm = self.model.blocks[layer].attn, _pre_norm(self.model.blocks[layer].ln_attn)
        weight, bias = {"q": (attention.W_Q, attention.b_Q), "k": (attention.W_K, attention.b_K),
                        "v": (attention.W_V, attention.b_V)}[name]

        def put(projected: Tensor, tokens: Tokens) -> Tensor:
            if self.taps is not None:
                self.taps.append((layer, name, self.resid["attn"], projected))
            if name == "q":
                self._read("attn_read", self.resid["attn"])
            if self._unchanged(layer, name):
                return projected
            if self._own(layer, name):  # every reader reads the reference's input: one norm and projection of its rows
                normalized = norm.normalize(self.reference.read(layer, name).to(projected.dtype))
                out = torch.einsum("npd,hde->nphe", normalized, weight)
                return self._over_circuits((out if bias is None else out + bias).to(projected.dtype), projected)
            normalized = norm.normalize(self.inputs(layer, name, self.resid["attn"]))
            out = torch.einsum("hbpd,hde->bphe", normalized, weight)
            return (out if bias is None else out + bias).to(projected.dtype)
        return put

    def _latent_query(self, layer: int):
        """Latent attention's q_proj: each head's from its own reader's input (x W_Q[h]), or with a query latent
        every head's from the one query reader's (through W_DQ, the latent's norm and W_UQ)."""
        attention, norm = self.model.blocks[layer].attn, _pre_norm(self.model.blocks[layer].ln_attn)

        def put(projected: Tensor, tokens: Tokens) -> Tensor:
            self._read("attn_read", self.resid["attn"])
            if self._unchanged(layer, "q"):
                return projected
            read = norm.normalize(self.inputs(layer, "q", self.resid["attn"]))
            if not attention.q_rank:
                return torch.einsum("hbpd,hde->bphe", read, attention.W_Q).to(projected.dtype)
            latent = attention.q_latent_norm.normalize(read[0] @ attention.W_DQ)
            return torch.einsum("bpr,hre->bphe", latent, attention.W_UQ).to(projected.dtype)
        return put

    def _latent_kv(self, layer: int):
        """Latent attention's keys and values: kv_latent from the one key/value reader's input (through the
        pre-norm, W_DKV and the latent's norm); every head's k (its first dims) and v follow from it."""
        attention, norm = self.model.blocks[layer].attn, _pre_norm(self.model.blocks[layer].ln_attn)

        def put(latent: Tensor, tokens: Tokens) -> Tensor:
            if self._unchanged(layer, "kv"):
                return latent
            self.kv_read = norm.normalize(self.inputs(layer, "kv", self.resid["attn"])[0])
            return attention.kv_latent_norm.normalize(self.kv_read @ attention.W_DKV).to(latent.dtype)
        return put

    def _rotary_key(self, layer: int):
        """Latent attention's rotary key dims of k_proj (x W_KR, shared by the heads) from the same reader."""
        attention = self.model.blocks[layer].attn

        def put(k: Tensor, tokens: Tokens) -> Tensor:
            if self._unchanged(layer, "kv"):
                return k
            rotary = (self.kv_read @ attention.W_KR).to(k.dtype)[:, :, None].expand(-1, -1, k.shape[2], -1)
            return torch.cat((k[..., : attention.nope], rotary), dim=-1)
        return put

    def _mlp_resid(self, layer: int):
        """Without pre-norms: the MLP reads resid_mid itself, so its input is put in there (its difference from
        resid_mid is taken back out of its write, `_mlp_write`)."""
        def put(resid: Tensor, tokens: Tokens) -> Tensor:
            self.resid["mlp"] = resid
            self._read("mlp_read", resid)
            if self._unchanged(layer, "mlp"):
                return resid
            read = self.inputs(layer, "mlp", resid)[0].to(resid.dtype)
            self.shift = read - resid
            return read
        return put

    def _cross_query(self, layer: int):
        """Each cross-attention head's q_proj from its own reader's input, through the cross pre-norm."""
        attention, norm = self.model.blocks[layer].cross, _pre_norm(self.model.blocks[layer].ln_cross)

        def put(projected: Tensor, tokens: Tokens) -> Tensor:
            if self._unchanged(layer, "cross_q"):
                return projected
            out = torch.einsum("hbpd,hde->bphe", norm.normalize(self.inputs(layer, "cross_q", self.resid["cross"])),
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
            read = self.source_norm(self.source.final_inputs[start:start + g])
            out = torch.einsum("gbsd,gde->bsge", read, weight)
            return (out if bias is None else out + bias).to(projected.dtype)
        return put

    def _final_inputs(self, resid: Tensor, tokens: Tokens) -> Tensor:
        """An encoder's last residual: kept as the inputs of its final readers (every cross-attention's keys and
        values; None where they read it unchanged), and passed on unchanged."""
        self._read("final", resid)
        if not self._unchanged(None, "final"):
            self.final_inputs = self.inputs(None, "final", resid)
        return resid

    def _mlp_input(self, layer: int):
        norm = self.model.blocks[layer].ln_mlp

        def put(normalized: Tensor, tokens: Tokens) -> Tensor:
            if self.taps is not None:
                self.taps.append((layer, "mlp", self.resid["mlp"], normalized))
            self._read("mlp_read", self.resid["mlp"])
            if self._unchanged(layer, "mlp"):
                return normalized
            return norm.normalize(self.inputs(layer, "mlp", self.resid["mlp"])[0]).to(normalized.dtype)
        return put

    def _logits(self, resid: Tensor, tokens: Tokens) -> Tensor:
        if self.taps is not None:
            self.taps.append((None, "logits", resid, resid))
        self._read("final", resid)
        if self._unchanged(None, "logits"):
            return resid
        return self.inputs(None, "logits", resid)[0].to(resid.dtype)


class _Unnormed:
    """The pre-norm of a model without pre-norms (OLMo 2): its readers read the residual itself."""

    @staticmethod
    def normalize(x: Tensor) -> Tensor:
        return x


def tappable(model: Transformer, graph: EdgeGraph) -> bool:
    """Whether taps (taps.input_gradients) give every reader's gradient: every reader a pre-norm projection
    (q_proj, k_proj, v, the MLP's normalized input) or the logits; latent attention, models without pre-norms and
    encoder-decoders take a zero probe on every reader's input instead."""
    return model.config.pre_norms and not graph.kv_latent and not graph.cross and graph.final == (LOGITS,)


def _pre_norm(norm):
    """A sublayer's pre-norm, or _Unnormed where it has none."""
    return _Unnormed if norm is None else norm


def repeat(tokens: Tokens, times: int) -> Tokens:
    """`tokens` stacked `times` times (the rows of `times` circuit blocks)."""
    if times == 1:
        return tokens
    return Tokens(*(t.repeat(times, 1) for t in (tokens.ids, tokens.attention_mask, tokens.position_ids)))


def plain_writes(model: Transformer, tokens: Tokens, prefix: SharedPrefix | None = None) -> Writes:
    """The writes and reads of a plain run of `tokens` (no gradient); with a prefix (of `tokens`' pairs), at the
    positions after it only."""
    edge_pass = EdgePass(model, EdgeGraph.of(model.config), None, None)
    logits = last_logits(model, tokens, edge_pass.interventions(), 1, prefix)
    return dataclasses.replace(edge_pass.writes(), logits=logits)


def patched_logits(model: Transformer, graph: EdgeGraph, tokens: Tokens, reference: Writes,
                   keep: Float[Tensor, "circuit writer reader"], prefix: SharedPrefix | None = None
                   ) -> Float[Tensor, "circuit n d_vocab"]:
    """The last-token logits of `tokens` (the clean prompts, n rows) with every edge weighted by keep[c]: one
    forward of C * n rows (with a prefix, over the positions after it, as `reference` was made)."""
    circuits = keep.shape[0]
    edge_pass = EdgePass(model, graph, reference, keep.to(model.device))
    logits = last_logits(model, tokens, edge_pass.interventions(), circuits, prefix)
    return logits.view(circuits, -1, logits.shape[-1])


def last_logits(model: Transformer, tokens: Tokens, interventions: list[Intervention], circuits: int = 1,
                prefix: SharedPrefix | None = None) -> Float[Tensor, "b d_vocab"]:
    """The last-token logits of `tokens` stacked `circuits` times with `interventions` (no gradient): a plain run,
    or with a prefix the positions after it."""
    if prefix is not None:
        return prefix.last_logits(model, tokens, interventions, circuits)
    with torch.no_grad():
        run = model.run(repeat(tokens, circuits), capture=Capture.none(), interventions=interventions,
                        logits_at="last")
    return run.logits[:, 0]
