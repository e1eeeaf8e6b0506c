"""Causal (or, for encoders, bidirectional) multi-head / grouped-query attention with per-head weight views,
optional q/k norms (Qwen3, Gemma 3, OLMo 2), score soft-capping (Gemma 2), a per-layer sliding window and rotary
(Gemma 2/3, Qwen2 windows), and decoders' cross-attention (keys and values from an encoder's output).

    q_proj, k_proj   the queries and keys as projected (x W_Q + b_Q), before any q/k norm and the rotary embedding
                     (TransformerLens's attn.hook_q / hook_k); where nothing transforms them they are q and k
                     (resid.records.same_fields), computed and kept once
    q, k             as the scores read them: q/k-normed, then rotated
    scores           q k^T * scale, soft-capped (Gemma 2), plus the relative position bias (T5), -inf at every key a
                     query may not read: the softmax's input (TransformerLens's attn.hook_attn_scores), in the model
                     dtype, [batch head pos key_pos]. A padding query reads itself (resid.components.attention's
                     allowed_keys), so its row holds its own score and -inf elsewhere
    pattern          softmax(scores) in float32, cast to the model dtype

Where SDPA computes z, a capture of the scores or the pattern keeps what they are made of (ScoreInputs: q and k,
the pass's shared masks) and forms them on their first read, so a full capture costs what SDPA costs and holds
what grows linearly with the prompt until a pattern is read.

Weights live in torch's linear layout ([out in], as in nn.Linear and Hugging Face checkpoints) so each
projection is one GEMM; that storage is private (`_w_q`, ...), and the one public name of each weight is its
per-head view, W_Q [head d_model d_head], W_O [head d_head d_model], ... (writing into a view edits the model).
Query head h reads key/value head h // (n_heads / n_kv_heads), as in Hugging Face's `repeat_kv`. Edited scores
or an edited pattern (Site(..., field="scores" | "pattern")) take the explicit path: z = softmax(scores) @ v.

What turns a head's query and key into its score is one frozen value, `Attention.score_rule` (a ScoreRule: the
scale, the soft cap and the query-to-key/value head map); the forward forms its scores with it, and so does any
reader that recomputes scores from queries and keys (an attribution graph's QK attribution). The rotary a layer's
queries and keys are turned by is the model's, Transformer.rotary_of(layer type).

With its pattern P frozen (an attribution graph's replacement model), attention is affine in what it reads; its
value path is the map `frozen`, and `frozen_adjoint` its linear part's adjoint (float32):

    frozen(x, P)         = sum_h P[h] (x W_V[h // group] + b_V[h // group]) W_O[h] + b_O      (group: GQA)
    frozen_adjoint(g, P) = sum_h P[h]^T g W_O[h]^T W_V[h // group]^T

and `frozen_adjoint_heads` keeps the terms of that sum apart, one per query head (an attribution graph's edges
split by the head that carries them, resid.analyses.graphs.heads).
"""

import dataclasses
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float
from torch import Tensor, nn

from resid.components.kv_cache import KVCache
from resid.components.norm import Norm
from resid.components.relative import RelativeBias
from resid.components.rotary import Rotary
from resid.components.score_rule import ScoreRule, score_scale, softmax
from resid.components.sinks import softmax_with_sinks
from resid.config import LayerType, ModelConfig
from resid.interventions import Edit, apply_edits
from resid.records import OnRead, same_fields


class CausalMask:
    """The plain causal mask of one pass, True at every key after its query ([pos key_pos], queries and keys the
    same positions): built on its first use and shared by every layer that reads it (the explicit path, T5's
    bias, the scores formed on read)."""

    def __init__(self) -> None:
        self._blocked: Tensor | None = None

    def __call__(self, n: int, device: torch.device) -> Bool[Tensor, "pos key_pos"]:
        if self._blocked is None or self._blocked.shape[-1] != n or self._blocked.device != device:
            self._blocked = torch.ones(n, n, dtype=torch.bool, device=device).triu(1)
        return self._blocked


@dataclass(frozen=True)
class AttnContext:
    """What every attention layer of one run shares, per layer type ("full" / "sliding")."""

    # True where a query may read a key; None: plain causal (nothing padded, no window reaches back), which
    # lets SDPA use its causal kernels instead of an explicit mask
    allowed: dict[str, Bool[Tensor, "batch 1 pos key_pos"] | None]
    blocked: dict[str, Bool[Tensor, "batch 1 pos key_pos"] | None]  # ~allowed, once per run (explicit path)
    rotary: dict[str, tuple[Tensor, Tensor]]  # Rotary.cos_sin of these position ids; empty for learned positions
    cache: KVCache | None = None  # generation only: keys/values of earlier positions, extended by this pass
    causal: bool = True  # False (encoders): allowed None means every key is readable
    # encoder-decoder decoders: the encoder's final hidden state, which cross-attention reads, and which of its
    # positions are real (None: all)
    memory: Float[Tensor, "batch src_pos d_model"] | None = None
    memory_allowed: Bool[Tensor, "batch 1 1 src_pos"] | None = None
    # relative position bias (T5): the model's tables, the bucket of every (query, key) pair, and each table's
    # additive score mask (bias, -inf where blocked), computed once per pass by the first layer that reads it
    relative: RelativeBias | None = None
    buckets: Tensor | None = None
    biases: dict[int, Tensor] = dataclasses.field(default_factory=dict)
    # the plain causal mask (blocked None, causal): built once per pass, on its first use
    causal_mask: CausalMask = dataclasses.field(default_factory=CausalMask)

    def position_bias(self, layer: int, dtype: torch.dtype) -> Float[Tensor, "#batch head pos key_pos"]:
        """What self-attention layer `layer` adds to its scores (relative position bias and the mask)."""
        table = self.relative.table(layer)
        if table not in self.biases:
            blocked = self.blocked["full"]
            if blocked is None and self.causal:  # plain causal: queries and keys are the same positions
                blocked = self.causal_mask(self.buckets.shape[-1], self.buckets.device)
            self.biases[table] = self.relative.bias(layer, self.buckets, blocked, dtype)
        return self.biases[table]

    @classmethod
    def build(
        cls, allowed: dict[str, Tensor | None], rotary: dict[str, tuple[Tensor, Tensor]], causal: bool = True
    ) -> "AttnContext":
        blocked = {kind: None if mask is None else ~mask for kind, mask in allowed.items()}
        return cls(allowed, blocked, rotary, causal=causal)


@dataclass(frozen=True, eq=False)
class ScoreInputs:
    """What one attention layer's scores are made of in a pass: the rule of the module docstring's `scores` (and
    `pattern`), whether the forward forms them (the explicit path, Transformer.attention_pattern) or a capture
    gives them on read (`on_read`). It holds the queries and keys as the scores read them and the pass's masks,
    which are shared by every layer of a type (nothing of its own that grows with the square of the prompt)."""

    q_h: Float[Tensor, "batch head pos d_head"]
    k_h: Float[Tensor, "batch kv_head key_pos d_head"]
    rule: ScoreRule
    bias: Tensor | None  # T5's relative position bias, which carries the mask [#batch head pos key_pos]
    blocked: Tensor | None  # True at the keys a query may not read [#batch 1 pos|1 key_pos]; None: see causal
    causal: CausalMask | None  # plain causal (nothing padded, no window reaching back): the pass's shared mask
    # Capture(positions=...): q_h holds the kept query positions, and rows(mask, axis=2) keeps the masks' rows
    rows: Callable[..., Tensor] | None = None
    sinks: Tensor | None = None  # one sink logit per head (gpt-oss; resid.components.sinks): in the pattern's softmax

    @classmethod
    def of(
        cls, attention: "Attention", q_h: Float[Tensor, "batch head pos d_head"],
        k_h: Float[Tensor, "batch kv_head key_pos d_head"], ctx: AttnContext,
        rows: Callable[..., Tensor] | None = None,
    ) -> "ScoreInputs":
        """`attention`'s score inputs in the pass of `ctx` (with `rows`: q_h is the kept query positions only)."""
        bias = blocked = causal = None
        if ctx.relative is not None and not attention.cross:  # the bias carries the mask
            bias = ctx.position_bias(attention.layer, q_h.dtype)
        elif attention.cross:
            blocked = None if ctx.memory_allowed is None else ~ctx.memory_allowed
        else:
            blocked = ctx.blocked[attention.layer_type]
            causal = ctx.causal_mask if blocked is None and ctx.causal else None
        return cls(q_h, k_h, attention.score_rule, bias, blocked, causal, rows, attention.sinks)

    def scores(self) -> Float[Tensor, "batch head pos key_pos"]:
        """q k^T * scale, soft-capped if the model caps them, plus the relative position bias of models with one,
        -inf at the keys a query may not read (the module docstring's `scores`)."""
        scores = self.rule.capped(self.rule.raw(self.q_h, self.rule.repeat_kv(self.k_h, dim=1)))
        if self.bias is not None:
            return scores + self._rows(self.bias)
        blocked = self.blocked if self.causal is None else self.causal(self.k_h.shape[2], scores.device)
        return scores if blocked is None else scores.masked_fill_(self._rows(blocked), float("-inf"))

    def pattern(self) -> Float[Tensor, "batch head pos key_pos"]:
        """softmax(scores) over the allowed keys (and the head's sink), in float32, cast to the queries' dtype."""
        return self._softmax(self.scores())

    def _softmax(self, scores: Tensor) -> Tensor:
        return softmax(scores, self.q_h.dtype) if self.sinks is None else softmax_with_sinks(scores, self.sinks,
                                                                                            self.q_h.dtype)

    def on_read(self, names: Collection[str]) -> dict[str, OnRead]:
        """The fields `names` ("scores", "pattern") given on read. The pattern is the softmax of the scores' own
        tensor where they were read first; otherwise it forms scores of its own and lets them go, so reading every
        pattern of a full capture never holds the scores too."""
        shape = (*self.q_h.shape[:3], self.k_h.shape[2])
        given = {"scores": OnRead(self.scores, shape)} if "scores" in names else {}
        if "pattern" in names:
            scores = given.get("scores")

            def pattern() -> Tensor:
                return self.pattern() if scores is None or not scores.formed else self._softmax(scores.value)

            given["pattern"] = OnRead(pattern, shape)
        return given

    def _rows(self, mask: Tensor) -> Tensor:
        """A mask at the kept query positions (as it is where every position is kept or it has no query axis)."""
        if self.rows is None or mask.shape[-2] == 1:
            return mask
        mask = mask.view((1,) * (4 - mask.ndim) + tuple(mask.shape)).expand(self.q_h.shape[0], -1, -1, -1)
        return self.rows(mask, axis=2)


def allowed_keys(
    attention_mask: Bool[Tensor, "batch pos"], sliding_window: int | None, causal: bool = True
) -> Bool[Tensor, "batch 1 pos key_pos"]:
    """Causal (or bidirectional), padding and sliding-window mask. Every position may read itself, so a padding
    row (which reads nothing real) stays finite instead of becoming NaN; real rows are unaffected."""
    n = attention_mask.shape[-1]
    query = torch.arange(n, device=attention_mask.device)[:, None]
    key = torch.arange(n, device=attention_mask.device)[None, :]
    allowed = key <= query if causal else torch.ones(n, n, dtype=torch.bool, device=attention_mask.device)
    if sliding_window is not None:
        allowed = allowed & (query - key < sliding_window)
    allowed = allowed[None] & attention_mask[:, None, :]
    allowed = allowed | (key == query)[None]
    return allowed[:, None]


class Attention(nn.Module):
    # fields of its record the value path reads frozen beside the pattern, passed to frozen / frozen_adjoint by name
    # (latent attention's kv_norm_scale); none here
    frozen_fields: tuple[str, ...] = ()

    def __init__(self, config: ModelConfig, layer: int, cross: bool = False):
        """Self-attention, or (cross=True) a decoder's cross-attention: queries from the stream, keys and values
        from the encoder's final hidden state (AttnContext.memory), no causal mask, no rotary."""
        super().__init__()
        self.layer = layer
        self.cross = cross
        self.layer_type: LayerType = "full" if cross else config.layer_type(layer)
        self.rotates = not cross and config.rotates(layer)  # False: cross-attention, learned positions, NoPE layers
        self.n_heads, self.n_kv_heads, self.d_head = config.n_heads, config.n_kv_heads, config.d_head
        d_model, d_q, d_kv = config.d_model, config.n_heads * config.d_head, config.n_kv_heads * config.d_head
        self.scale, self.softcap = score_scale(config), config.attn_softcap  # score_rule's pieces
        # q/k RMSNorm before rotary: over each head's d_head dims, or over the whole projection (OLMo 2)
        self.qk_norm = config.qk_norm
        self.norm_after_rotary = config.qk_norm_after_rotary  # Hunyuan: rotate q and k, then norm them
        per_head = config.qk_norm == "head"
        self.q_norm = Norm(config, config.d_head if per_head else d_q, rms=True) if config.qk_norm != "none" else None
        self.k_norm = Norm(config, config.d_head if per_head else d_kv, rms=True) if config.qk_norm != "none" else None
        self._w_q = nn.Parameter(torch.zeros(d_q, d_model))
        self._w_k = nn.Parameter(torch.zeros(d_kv, d_model))
        self._w_v = nn.Parameter(torch.zeros(d_kv, d_model))
        self._w_o = nn.Parameter(torch.zeros(d_model, d_q))
        qkv_bias = config.attn_qkv_bias
        self._b_q = nn.Parameter(torch.zeros(d_q)) if qkv_bias else None
        self._b_k = nn.Parameter(torch.zeros(d_kv)) if qkv_bias else None
        self._b_v = nn.Parameter(torch.zeros(d_kv)) if qkv_bias else None
        self.b_O = nn.Parameter(torch.zeros(d_model)) if config.attn_out_bias else None
        self.sinks = nn.Parameter(torch.zeros(config.n_heads)) if config.attn_sinks and not cross else None
        # q_proj -> q, k_proj -> k where nothing transforms the projection: recorded as q and k, not twice
        self.same = same_fields(config, cross)

    @property
    def score_rule(self) -> ScoreRule:
        """What turns this attention's queries and keys into its scores (the scale, the soft cap, the head map)."""
        return ScoreRule(self.scale, self.softcap, self.n_heads // self.n_kv_heads)

    @property
    def W_Q(self) -> Float[Tensor, "head d_model d_head"]:
        return self._w_q.view(self.n_heads, self.d_head, -1).transpose(1, 2)

    @property
    def W_K(self) -> Float[Tensor, "kv_head d_model d_head"]:
        return self._w_k.view(self.n_kv_heads, self.d_head, -1).transpose(1, 2)

    @property
    def W_V(self) -> Float[Tensor, "kv_head d_model d_head"]:
        return self._w_v.view(self.n_kv_heads, self.d_head, -1).transpose(1, 2)

    @property
    def W_O(self) -> Float[Tensor, "head d_head d_model"]:
        return self._w_o.T.view(self.n_heads, self.d_head, -1)

    @property
    def b_Q(self) -> Float[Tensor, "head d_head"] | None:
        return None if self._b_q is None else self._b_q.view(self.n_heads, self.d_head)

    @property
    def b_K(self) -> Float[Tensor, "kv_head d_head"] | None:
        return None if self._b_k is None else self._b_k.view(self.n_kv_heads, self.d_head)

    @property
    def b_V(self) -> Float[Tensor, "kv_head d_head"] | None:
        return None if self._b_v is None else self._b_v.view(self.n_kv_heads, self.d_head)

    def forward(
        self,
        normalized: Float[Tensor, "batch pos d_model"],
        ctx: AttnContext,
        want: frozenset[str],
        edits: Sequence[Edit],
    ) -> tuple[Float[Tensor, "batch pos d_model"], dict[str, Tensor]]:
        """The attention output before any post-norm (resid.components.block applies that, and the write edits);
        head edits act on z here."""
        batch, n_pos, _ = normalized.shape
        if want and self.same:  # q_proj / k_proj are kept as q / k: the same tensor
            want = want | {self.same[name] for name in want & self.same.keys()}
        projected: dict[str, Tensor] = {}  # q_proj and k_proj, where they differ from q and k and are wanted
        cached = ctx.cache.cross.get(self.layer) if self.cross and ctx.cache is not None else None
        if cached is not None:  # a generation step: the source's keys and values as the first pass made them
            q = self._queries(normalized, edits, want, projected)
            k, v = cached[0].transpose(1, 2), cached[1].transpose(1, 2)
            q = apply_edits(q, edits, "q") if edits else q
        else:
            q, k, v = self._qkv(normalized, ctx, edits, want, projected)
            if edits:  # a head's q, k or v, as the scores read them (Site(..., field="q"))
                q, k, v = apply_edits(q, edits, "q"), apply_edits(k, edits, "k"), apply_edits(v, edits, "v")
        # [batch head pos d_head] for the score matmuls
        q_h, k_h, v_h = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if ctx.cache is not None and self.cross and cached is None:
            ctx.cache.cross[self.layer] = (k_h, v_h)
        if ctx.cache is not None and not self.cross:
            # Cached keys were rotated at their own positions, so the new queries read them as they are.
            k_h, v_h = ctx.cache.extend(self.layer, k_h, v_h)
        scores = pattern = None
        edited = {iv.site.what for iv, _ in edits} & {"scores", "pattern"} if edits else ()
        rule = self.score_rule
        if rule.softcap is not None or edited or self.sinks is not None:
            # SDPA cannot soft-cap scores, add sinks, nor take edited scores or an edited pattern: the explicit path,
            # as Hugging Face's eager attention computes it. Both are edited as [batch pos head key_pos], the layout
            # every head edit uses.
            scores = self.scores_of(q_h, k_h, ctx)
            if "scores" in edited:
                scores = apply_edits(scores.transpose(1, 2), edits, "scores").transpose(1, 2)
            pattern = softmax(scores, q_h.dtype) if self.sinks is None else softmax_with_sinks(scores, self.sinks,
                                                                                               q_h.dtype)
            if "pattern" in edited:
                pattern = apply_edits(pattern.transpose(1, 2), edits, "pattern").transpose(1, 2)
            z_h = pattern @ rule.repeat_kv(v_h, dim=1)
        else:
            # z comes from SDPA, so capturing the scores or the pattern (formed on read from q and k, ScoreInputs)
            # cannot change the numbers, and costs nothing until they are read.
            relative = ctx.relative is not None and not self.cross
            mask = ctx.memory_allowed if self.cross else (
                ctx.position_bias(self.layer, q_h.dtype) if relative else ctx.allowed[self.layer_type])
            causal = mask is None and ctx.causal and not self.cross
            z_h = F.scaled_dot_product_attention(
                q_h, k_h, v_h, attn_mask=mask, is_causal=causal, scale=rule.scale, enable_gqa=rule.group != 1,
            )
            if ctx.cache is not None and want & {"scores", "pattern"}:  # a cached pass: its keys are the cache's
                scores = self.scores_of(q_h, k_h, ctx)
                pattern = softmax(scores, q_h.dtype) if "pattern" in want else None  # (no sinks: they take the
                # explicit path above)
        z = apply_edits(z_h.transpose(1, 2), edits, "z")
        out = F.linear(z.reshape(batch, n_pos, -1), self._w_o, self.b_O)
        values = {"q": q, "k": k, "v": v, "scores": scores, "pattern": pattern, "z": z, **projected}
        if scores is None and want & {"scores", "pattern"}:  # given on read from q and k (resid.forward's _record)
            want = want | {"q", "k"}
        return out, {name: values[name] for name in want if values.get(name) is not None}

    def frozen(
        self,
        normalized: Float[Tensor, "key_pos d_model"],
        pattern: Float[Tensor, "head pos key_pos"],
        constants: bool = True,
    ) -> Float[Tensor, "pos d_model"]:
        """The output (before any post-norm) of one prompt's attention with its pattern frozen, in float32: each
        key's values from `normalized` (what the attention reads), mixed by the pattern, through W_O; with
        `constants` b_V and b_O, without them the linear part (whose adjoint is frozen_adjoint)."""
        v = torch.einsum("kd,gde->gke", normalized.float(), self.W_V.float())
        if constants and self.b_V is not None:
            v = v + self.b_V.float()[:, None, :]
        v = self.score_rule.repeat_kv(v, dim=0)  # [head key_pos d_head]
        z = pattern.float() @ v  # [head pos d_head]
        out = torch.einsum("hqe,hed->qd", z, self.W_O.float())
        return out + self.b_O.float() if constants and self.b_O is not None else out

    def frozen_adjoint(
        self, g: Float[Tensor, "batch pos d_model"], pattern: Float[Tensor, "head pos key_pos"]
    ) -> Float[Tensor, "batch key_pos d_model"]:
        """The cotangents on what the attention reads from cotangents g on its output (a batch of them, one
        prompt's frozen pattern), float32: frozen(x, P, constants=False) . g == x . frozen_adjoint(g, P)."""
        gz = torch.einsum("bqd,hed->bhqe", g.float(), self.W_O.float())
        gv = torch.einsum("hqk,bhqe->bhke", pattern.float(), gz)
        batch, _, keys, d_head = gv.shape
        gv = gv.view(batch, self.n_kv_heads, self.score_rule.group, keys, d_head).sum(2)  # GQA: a group's sum
        return torch.einsum("bgke,gde->bkd", gv, self.W_V.float())

    def frozen_adjoint_heads(
        self, g: Float[Tensor, "batch pos d_model"], pattern: Float[Tensor, "head pos key_pos"]
    ) -> Float[Tensor, "batch head key_pos d_model"]:
        """frozen_adjoint split by query head: head h's term P[h]^T g W_O[h]^T W_V[h // group]^T (float32). The
        heads sum to frozen_adjoint(g, P); under GQA, heads sharing a value head stay apart."""
        gz = torch.einsum("bqd,hed->bhqe", g.float(), self.W_O.float())
        gv = torch.einsum("hqk,bhqe->bhke", pattern.float(), gz)
        w_v = self.score_rule.repeat_kv(self.W_V.float(), dim=0)  # [head d_model d_head]
        return torch.einsum("bhke,hde->bhkd", gv, w_v)

    def _qkv(
        self, normalized: Tensor, ctx: AttnContext, edits: Sequence[Edit], want: frozenset[str],
        projected: dict[str, Tensor],
    ) -> tuple[Tensor, Tensor, Tensor]:
        """q [batch pos head d_head], k and v [batch key_pos kv_head d_head]: projected (q_proj, k_proj: edited,
        and kept in `projected` where wanted), q/k-normed, rotated."""
        source = ctx.memory if self.cross else normalized  # what keys and values are read from
        # [batch * pos, d_model]: each projection is one 2-D matmul (F.linear of 3-D input reshapes around it)
        rows = normalized.flatten(0, 1)
        source_rows = source.flatten(0, 1) if self.cross else rows
        q = self._projected("q", rows, normalized.shape[:-1], edits, want, projected)
        k = self._projected("k", source_rows, source.shape[:-1], edits, want, projected)
        v = self._heads(source_rows, source.shape[:-1], self._w_v, self._b_v, self.n_kv_heads)
        rotate = bool(ctx.rotary) and self.rotates
        if rotate and self.norm_after_rotary:
            q, k = Rotary.apply_qk(q, k, *ctx.rotary[self.layer_type])
        if self.qk_norm == "all":  # over the whole projection (OLMo 2)
            q = self.q_norm.normalize(q.flatten(-2)).view(q.shape)
            k = self.k_norm.normalize(k.flatten(-2)).view(k.shape)
        if self.qk_norm == "head":
            q, k = self.q_norm.normalize(q), self.k_norm.normalize(k)
        if rotate and not self.norm_after_rotary:
            q, k = Rotary.apply_qk(q, k, *ctx.rotary[self.layer_type])
        return q, k, v

    def _queries(
        self, normalized: Tensor, edits: Sequence[Edit], want: frozenset[str], projected: dict[str, Tensor]
    ) -> Tensor:
        """A cross-attention's q alone (its keys and values are cached): projected and q-normed."""
        q = self._projected("q", normalized.flatten(0, 1), normalized.shape[:-1], edits, want, projected)
        if self.qk_norm == "all":
            q = self.q_norm.normalize(q.flatten(-2)).view(q.shape)
        return self.q_norm.normalize(q) if self.qk_norm == "head" else q

    def _projected(
        self, name: str, rows: Tensor, lead: torch.Size, edits: Sequence[Edit], want: frozenset[str],
        projected: dict[str, Tensor],
    ) -> Tensor:
        """q_proj [batch pos head d_head] (name "q") or k_proj [batch key_pos kv_head d_head] ("k"): the projection of
        `rows` (what is read, [batch * pos, d_model], `lead` its [batch pos]), its edits applied (where it is q or
        k, the edits of q or k follow on the same tensor)."""
        weight, bias, heads = (self._w_q, self._b_q, self.n_heads) if name == "q" else (
            self._w_k, self._b_k, self.n_kv_heads)
        out = self._heads(rows, lead, weight, bias, heads)
        if edits or want:
            field = f"{name}_proj"
            out = apply_edits(out, edits, field) if edits else out
            if field in want and field not in self.same:
                projected[field] = out
        return out

    def _heads(self, rows: Tensor, lead: torch.Size, weight: Tensor, bias: Tensor | None, heads: int) -> Tensor:
        """rows [batch * pos, d_model] projected by one weight [heads * d_head, d_model], as [*lead heads d_head]."""
        return F.linear(rows, weight, bias).view(*lead, heads, self.d_head)

    def frozen_qk(
        self,
        name: str,
        normalized: Float[Tensor, "n d_model"],
        norm_scale: Float[Tensor, "n qk_heads 1"] | None,
        cos: Float[Tensor, "n 1 rot"] | None,
        sin: Float[Tensor, "n 1 rot"] | None,
        constants: bool = True,
    ) -> Float[Tensor, "n heads d_head"]:
        """The queries (name "q", [n head d_head]) or keys ("k", [n kv_head d_head]) of rows of what the attention
        reads, each row at its own position, in float32: projected (plus b_Q / b_K with `constants`), q/k-normed
        with the run's scale frozen (`norm_scale`: per head [n head 1] or over the whole projection [n 1 1]; None
        without q/k norms), rotated by each row's angles (cos, sin; None without rotary). Affine in `normalized`,
        so the score q . k * scale is a bilinear form in what the query and key positions read (an attribution
        graph's QK attribution); constants=False gives the linear part."""
        weight, bias, norm = (self.W_Q, self.b_Q, self.q_norm) if name == "q" else (self.W_K, self.b_K, self.k_norm)
        out = torch.einsum("nd,hde->nhe", normalized.float(), weight.float())
        if constants and bias is not None:
            out = out + bias.float()
        if cos is not None and self.norm_after_rotary:  # the rotation keeps each head's RMS, so the scale holds
            out = Rotary.apply(out[None], cos.float()[None], sin.float()[None])[0]
        if norm is not None:  # RMSNorm: no bias, so frozen it is linear: x * gain * scale
            flat = out.flatten(-2) if self.qk_norm == "all" else out
            scale = norm_scale.flatten(-2) if self.qk_norm == "all" else norm_scale
            out = norm.frozen(flat, scale, constants=False).view(out.shape)
        if cos is not None and not self.norm_after_rotary:
            out = Rotary.apply(out[None], cos.float()[None], sin.float()[None])[0]  # the rows as one batch
        return out

    def qk_norm_scale(
        self, name: str, projected: Float[Tensor, "n heads d_head"]
    ) -> Float[Tensor, "n qk_heads 1"] | None:
        """The q/k norm's scale (name "q": of queries, "k": of keys) of projected rows (q_proj or k_proj) as frozen_qk
        takes it: per head [n head 1], or over the whole projection [n 1 1] (OLMo 2); None without q/k norms."""
        norm = self.q_norm if name == "q" else self.k_norm
        if norm is None:
            return None
        if self.qk_norm == "all":
            return norm(projected.flatten(-2))[1][:, None]
        return norm(projected)[1]

    def pattern_of(
        self,
        q_h: Float[Tensor, "batch head pos d_head"],
        k_h: Float[Tensor, "batch kv_head key_pos d_head"],
        ctx: AttnContext,
    ) -> Float[Tensor, "batch head pos key_pos"]:
        """softmax(scores) over the allowed keys, in float32, as the eager Hugging Face attention does."""
        return ScoreInputs.of(self, q_h, k_h, ctx).pattern()

    def scores_of(
        self,
        q_h: Float[Tensor, "batch head pos d_head"],
        k_h: Float[Tensor, "batch kv_head key_pos d_head"],
        ctx: AttnContext,
    ) -> Float[Tensor, "batch head pos key_pos"]:
        """q k^T * scale, soft-capped if the model caps them, plus the relative position bias of models with one,
        -inf at the keys a query may not read (the module docstring's `scores`; ScoreInputs)."""
        return ScoreInputs.of(self, q_h, k_h, ctx).scores()

