"""The edge-patched forward pass: each reader of the edge graph (resid.analyses.circuits.graph) reads its own input,

    input_r = resid_r + sum_w (1 - keep[w, r]) (reference_w - write_w) + probe_r

where resid_r is the residual the reader's sublayer reads in this pass (resid_pre, or resid_mid for a sequential
block's MLP, the final residual for the logits), write_w a writer's output in this pass and reference_w its output in
the reference run (the corrupt prompt, or a mean). With keep = 1 the pass is the model's own; with keep = 0 every
reader reads the reference run's input, so every node computes the reference run's output; a circuit keeps its
edges at 1. `probe` (zeros that require a gradient) gives d metric / d input_r of every reader from one backward pass
(EAP-IG on the activations, resid.analyses.circuits.eap).

With nothing patched (`keep` None: EAP, EAP-IG on the inputs) every reader's input is the residual its sublayer
reads, so the pass is the model's own forward and `taps` gives the same gradients without a probe: the backward pass
stops at each reader group's own tensor (a head's q_proj, a key/value head's k_proj and v, the MLP's normalized
input, the final residual), and `input_gradients` pushes those back through W_Q[h], W_K[g] and W_V[g] and the
pre-norm's Jacobian at the layer's residual, every head of a layer in one batched vector-Jacobian product of the
norm's own forward.

Everything goes through the model's own forward and resid.Hook interventions on whole fields (no second copy of
the attention): the residual a sublayer reads is seen at resid_pre / resid_mid (and returned unchanged), writes at
a head's z and an MLP's out, and the inputs are put in at a head's q_proj, k_proj and v (each query head's and each
key/value head's own input through the pre-norm and its projection) and at the MLP's normalized input. The pass's
rows are `circuits` blocks of the pairs' rows (circuit-major): keep is [circuit writer reader], the reference
[pair ...] is shared by the blocks.

Glossary: n the pairs of a batch, C the circuits run together, b = C * n the rows of the pass, W writers, R readers.
"""

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from resid.analyses.circuits.graph import EdgeGraph
from resid.capture import Capture
from resid.interventions import Hook
from resid.model import Transformer
from resid.sites import Site
from resid.tokenizer import Tokens


@dataclass(frozen=True)
class Writes:
    """Every writer's output in one run, as the run computed it: the embeddings' sum [n pos d_model], each layer's
    head mixes z [n pos head d_head] (a head writes z[h] @ W_O[h]) and MLP writes [n pos d_model]. A mean
    reference holds [1 1 ...] tensors."""

    embed: Float[Tensor, "n pos d_model"]
    z: tuple[Float[Tensor, "n pos head d_head"], ...]
    mlp: tuple[Float[Tensor, "n pos d_model"], ...]

    @classmethod
    def of(cls, model: Transformer, tokens: Tokens) -> "Writes":
        """The writes of a plain run of `tokens` (no gradient)."""
        with torch.no_grad():
            run = model.run(tokens, capture=Capture(attn={"z"}, mlp={"out"}, final_norm_scale=False),
                            logits_at="last")
        stream = run.stream
        return cls(stream.resid_pre(0), tuple(layer.attn.z for layer in stream.layers),
                   tuple(layer.mlp.out for layer in stream.layers))

    def mean(self, mask: Float[Tensor, "n pos"]) -> "Writes":
        """Mean ablation's reference: every write averaged over the real positions of every prompt."""
        weight = mask.to(self.embed.dtype)
        total = weight.sum()

        def average(t: Tensor) -> Tensor:
            w = weight.view(*weight.shape, *([1] * (t.dim() - 2)))
            return ((t * w).sum((0, 1)) / total)[None, None]

        return Writes(average(self.embed), tuple(map(average, self.z)), tuple(map(average, self.mlp)))


class EdgePass:
    """The hooks of one edge-patched pass (see the module docstring). `keep` [circuit writer reader] or None (every
    edge kept: nothing is patched); `probe` [b pos reader d_model] or None; `embed` [b pos d_model] or None: what the
    embeddings write in this pass instead of the tokens' own (EAP-IG on the inputs)."""

    def __init__(self, model: Transformer, graph: EdgeGraph, reference: Writes | None,
                 keep: Float[Tensor, "circuit writer reader"] | None, probe: Tensor | None = None,
                 embed: Tensor | None = None, taps: bool = False):
        """`taps`: record what every reader group's input goes into, for input_gradients (only where nothing is
        patched or probed: the readers then read the model's own residual)."""
        self.model, self.graph, self.reference, self.probe, self.embed = model, graph, reference, probe, embed
        # with taps: what each reader group's input went into, in stream order ((layer, field, resid read, tensor);
        # layer None: the logits), for input_gradients
        self.taps: list[tuple[int | None, str, Tensor, Tensor]] | None = [] if taps else None
        self.patched = None if keep is None else (1 - keep.to(model.dtype))  # the weight of each term swapped
        self.circuits = 1 if keep is None else keep.shape[0]
        # what the swapped terms add to each reader's input so far, [b pos reader d_model]: each writer group's
        # (reference - write) is spread over every reader after it as soon as it is written, one einsum per group
        self.pending: Tensor | None = None
        self.resid: dict[str, Tensor] = {}
        self.seen: dict[str, list[Tensor]] = {"embed": [], "z": [], "mlp": []}  # this pass's writes (`writes()`)

    def writes(self) -> Writes:
        """The writes this pass computed (detached), once it has run: with nothing patched and no embeddings given,
        the run's own (EAP's clean writes, without a forward pass of their own)."""
        return Writes(self.seen["embed"][0], tuple(self.seen["z"]), tuple(self.seen["mlp"]))

    def interventions(self) -> list[Hook]:
        hooks = [Hook(Site(0, "resid_pre"), self._embeddings)]
        for layer in range(self.graph.n_layers):
            hooks += [
                Hook(Site(layer, "resid_pre"), self._keep("attn")) if layer else None,
                Hook(Site(layer, "attn", field="q_proj"), self._projection(layer, "q")),
                Hook(Site(layer, "attn", field="k_proj"), self._projection(layer, "k")),
                Hook(Site(layer, "attn", field="v"), self._projection(layer, "v")),
                Hook(Site(layer, "attn", field="z"), self._heads(layer)),
                None if self.graph.parallel else Hook(Site(layer, "resid_mid"), self._keep("mlp")),
                Hook(Site(layer, "mlp", field="normalized"), self._mlp_input(layer)),
                Hook(Site(layer, "mlp", field="out"), self._mlp_write(layer)),
            ]
        hooks.append(Hook(Site(self.graph.n_layers - 1, "resid_post"), self._logits))
        return [hook for hook in hooks if hook is not None]

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

    def _heads(self, layer: int):
        def seen(z: Tensor, tokens: Tokens) -> Tensor:
            self.seen["z"].append(z.detach())
            if self.patched is not None:
                w_o = self.model.blocks[layer].attn.W_O
                diff = torch.einsum("nphe,hed->nphd", self._reference_minus(z, self.reference.z[layer]), w_o)
                self._spread(self.graph.writer_slice(layer, "attn"), diff)
            return z
        return seen

    def _mlp_write(self, layer: int):
        def seen(out: Tensor, tokens: Tokens) -> Tensor:
            self.seen["mlp"].append(out.detach())
            if self.patched is not None:
                diff = self._reference_minus(out, self.reference.mlp[layer])[:, :, None]
                self._spread(self.graph.writer_slice(layer, "mlp"), diff)
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
        if writer == 0:
            return 0
        layer, offset = divmod(writer - 1, self.graph.per_layer_writers)
        if offset < self.graph.n_heads and not self.graph.parallel:  # a head: its own layer's MLP reads it
            return self.graph.reader_slice(layer, "mlp").start
        return self.graph.reader_slice(layer + 1, "q").start if layer + 1 < self.graph.n_layers else (
            len(self.graph.readers) - 1)

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
        attention, norm = self.model.blocks[layer].attn, self.model.blocks[layer].ln_attn
        weight, bias = {"q": (attention.W_Q, attention.b_Q), "k": (attention.W_K, attention.b_K),
                        "v": (attention.W_V, attention.b_V)}[name]

        def put(projected: Tensor, tokens: Tokens) -> Tensor:
            if self.taps is not None:
                self.taps.append((layer, name, self.resid["attn"], projected))
            if self.patched is None and self.probe is None:
                return projected
            normalized = norm.normalize(self.inputs(layer, name, self.resid["attn"]))
            out = torch.einsum("bphd,hde->bphe", normalized, weight)
            return (out if bias is None else out + bias).to(projected.dtype)
        return put

    def _mlp_input(self, layer: int):
        norm = self.model.blocks[layer].ln_mlp

        def put(normalized: Tensor, tokens: Tokens) -> Tensor:
            if self.taps is not None:
                self.taps.append((layer, "mlp", self.resid["mlp"], normalized))
            if self.patched is None and self.probe is None:
                return normalized
            return norm.normalize(self.inputs(layer, "mlp", self.resid["mlp"])[:, :, 0]).to(normalized.dtype)
        return put

    def _logits(self, resid: Tensor, tokens: Tokens) -> Tensor:
        if self.taps is not None:
            self.taps.append((None, "logits", resid, resid))
        if self.patched is None and self.probe is None:
            return resid
        return self.inputs(None, "logits", resid)[:, :, 0].to(resid.dtype)


    # --- gradients without a probe ------------------------------------------------------------------------------------
    def input_gradients(self, value: Float[Tensor, ""]) -> Float[Tensor, "b pos reader d_model"]:
        """d value / d input_r of every reader (in float32 at least), from a pass run with taps: the same numbers a
        zero probe on every reader's input gives, from one backward pass that stops at the taps."""
        exact = torch.promote_types(self.model.dtype, torch.float32)
        grads = torch.autograd.grad(value, [tensor for *_, tensor in self.taps])
        by_group = {(layer, field): (resid, g) for (layer, field, resid, _), g in zip(self.taps, grads)}
        columns = []
        for layer in range(self.graph.n_layers):
            attention, block = self.model.blocks[layer].attn, self.model.blocks[layer]
            projected = [torch.einsum("bphe,hde->bphd", by_group[(layer, field)][1].to(exact), weight.to(exact))
                         for field, weight in (("q", attention.W_Q), ("k", attention.W_K), ("v", attention.W_V))]
            columns.append(_norm_adjoint(block.ln_attn, by_group[(layer, "q")][0], torch.cat(projected, 2)))
            resid, g = by_group[(layer, "mlp")]
            columns.append(_norm_adjoint(block.ln_mlp, resid, g.to(exact)[:, :, None]))
        columns.append(by_group[(None, "logits")][1].to(exact)[:, :, None])
        return torch.cat(columns, 2)


def _norm_adjoint(norm, resid: Float[Tensor, "b pos d_model"],
                  u: Float[Tensor, "b pos r d_model"]) -> Float[Tensor, "b pos r d_model"]:
    """u[:, :, r] pulled back through the norm's Jacobian at `resid`, for every r at once: one vector-Jacobian
    product of the norm's own forward, batched over r (in u's dtype)."""
    with torch.enable_grad():
        x = resid.detach().to(u.dtype).requires_grad_(True)
        (g,) = torch.autograd.grad(norm.normalize(x), x, u.movedim(2, 0), is_grads_batched=True)
    return g.movedim(0, 2)


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
