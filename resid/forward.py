"""The one forward pass of a Transformer, which `run`, `resume`, `attention_pattern` and `generate` all call:

    context    masks (causal, padding, sliding window), rotary angles, the encoded source, a KV cache
    embed      token (+ learned or sinusoidal position, + token type) embedding writes, edited, summed, normed
    blocks     layers start..n-1, each reading the residual and adding its writes; edits of residual sites
               (resid_pre / resid_mid / resid_cross / resid_post) and of sublayers applied where they lie
    unembed    the final norm and the head, at the positions asked for

Non-finite values are an error in every dtype: a pass whose final hidden state (or, in half precision, whose
logits) is not finite raises a ResidError naming the first site that went non-finite (found by running the
same pass again with every write recorded), unless the caller opts out (`Transformer.run(check_finite=False)`).
"""

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from resid.capture import Capture
from resid.components.attention import AttnContext, ScoreInputs, allowed_keys
from resid.components.kv_cache import KVCache
from resid.errors import ResidError, param, python_only
from resid.finite import all_finite
from resid.interventions import apply_edits, edit_residual
from resid.records import AttnRecord, CrossRecord, LayerRecord, MLPRecord, OnRead, absent_fields, same_fields
from resid.run import Memory
from resid.selection import LogitsAt, logit_index
from resid.sites import Site
from resid.tokenizer import Tokens

EMBEDDINGS = ("embed", "pos_embed", "type_embed")


@dataclass
class Pass:
    """What one forward pass computed (records only for the layers and fields its Capture kept)."""

    embeddings: dict[str, Tensor]  # the embedding writes present ("embed", "pos_embed", "type_embed"); {} resumed
    embed_scale: Tensor | None  # the embedding norm's scale (BERT)
    records: list[LayerRecord]
    logits: Tensor | None  # None without a head
    final_scale: Tensor | None  # None when the pass stopped before the final norm
    uncapped: Tensor | None  # logits before a final soft cap (models with one)
    hidden: Tensor  # the final norm's output at the positions asked for


def context(model, tokens: Tokens, memory: Memory | None = None, cache: KVCache | None = None,
            allowed: dict[str, Tensor] | None = None, key_positions: Tensor | None = None) -> AttnContext:
    """What every attention layer of a pass shares. `allowed` (generation steps): which cached keys each layer
    type's new position may read, instead of the masks of `tokens`; `key_positions` [batch key_pos]: the
    position ids of those keys (relative position bias), by default those of `tokens`."""
    cfg = model.config
    kinds = cfg.layer_types_used
    rotaries = {kind: model.rotary_of(kind) for kind in kinds}
    distinct = {id(rotary): rotary for rotary in rotaries.values() if rotary is not None}
    angles = {key: rotary.cos_sin(tokens.position_ids, model.dtype) for key, rotary in distinct.items()}  # once each
    rotary = {kind: angles[id(found)] for kind, found in rotaries.items() if found is not None}
    if allowed is None:
        n_pos, padded = tokens.ids.shape[1], not bool(tokens.attention_mask.all())

        def mask(kind: str) -> Tensor | None:  # None: plain causal, SDPA's causal kernels apply
            window = cfg.window(kind)
            if not padded and (window is None or window >= n_pos):
                return None
            return allowed_keys(tokens.attention_mask, window, cfg.causal)

        allowed = {kind: mask(kind) for kind in kinds}
    ctx = dataclasses.replace(AttnContext.build(allowed, rotary, cfg.causal), cache=cache)
    if model.relative is not None:
        keys = tokens.position_ids if key_positions is None else key_positions
        ctx = dataclasses.replace(ctx, relative=model.relative,
                                  buckets=model.relative.buckets(tokens.position_ids, keys.to(tokens.position_ids)))
    if memory is not None:
        real = memory.mask.to(model.device)
        ctx = dataclasses.replace(ctx, memory=memory.hidden.to(model.dtype),
                                  memory_allowed=None if bool(real.all()) else real[:, None, None, :])
    return ctx


def embed(model, tokens: Tokens, edits: dict) -> tuple[Tensor, dict[str, Tensor], Tensor | None]:
    """(resid_pre of layer 0, the embedding writes after their edits, the embedding norm's scale or None)."""
    found = {"embed": model.embed(tokens.ids)}
    if model.pos_embed is not None:
        found["pos_embed"] = model.pos_embed(tokens.position_ids)
    if model.type_embed is not None:
        found["type_embed"] = model.type_embed(tokens.ids)
    found = {name: apply_edits(write, edits.get(Site(None, name), ()), "write") for name, write in found.items()}
    writes = list(found.values())
    resid = writes[0]
    for write in writes[1:]:  # in this order, as the stream sums them (resid.stream)
        resid = resid + write
    scale = None
    if model.ln_embed is not None:
        resid, scale = model.ln_embed(resid)
    return resid, found, scale


def forward(model, tokens: Tokens, edits: dict, capture: Capture, keep, *, start: int = 0, resid: Tensor | None = None,
            ctx: AttnContext | None = None, logits_at: LogitsAt = None, check: bool = True,
            stop: int | None = None) -> Pass:
    """Layers start..n-1 from `resid` (the embeddings of `tokens` when None), then the final norm and the head.
    `keep` selects the captured positions (resid.selection.position_selector), None to record nothing. `stop`:
    run layers start..stop-1 only, and neither the final norm nor the head (no logits; `hidden` is the residual
    after layer stop-1)."""
    ctx = context(model, tokens) if ctx is None else ctx
    embeddings, scale = {}, None
    if resid is None:
        resid, embeddings, scale = embed(model, tokens, edits)
    records = []
    end = model.config.n_layers if stop is None else stop
    for layer in range(start, end):
        block = model.blocks[layer]
        kept = keep is not None and capture.keeps_layer(layer, model.config.n_layers)
        want = {part: capture.fields(part) for part in block.parts} if kept else {}
        deltas: dict[str, Tensor] = {}
        # this layer's edits by part (the block's sublayers and its residual sites); a pass without edits builds no
        # Sites, seven per layer, which cost a small model more time than some of its kernels
        parts = (*block.parts, "resid_pre", "resid_mid", "resid_cross", "resid_post")
        at = {part: edits.get(Site(layer, part), ()) for part in parts} if edits else {}
        resid = edit_residual(resid, at.get("resid_pre", ()), "resid_pre", deltas)
        resid, values = block(resid, ctx, want, at, deltas)
        resid = edit_residual(resid, at.get("resid_post", ()), "resid_post", deltas)
        if keep is not None:
            records.append(_record(model, layer, values, deltas, keep, want, ctx))
    if end < model.config.n_layers:
        if check and ctx.cache is None:
            _check_finite(model, None, resid, tokens, edits, start, resid if start else None, ctx, logits_at)
        return Pass(embeddings, scale, records, None, None, None, resid)
    logits, final_scale, uncapped, hidden = _unembed(model, resid, tokens, logits_at)
    if check and ctx.cache is None:  # generation checks its steps itself (resid.generate)
        _check_finite(model, logits, hidden, tokens, edits, start, resid if start else None, ctx, logits_at)
    return Pass(embeddings, scale, records, logits, final_scale, uncapped, hidden)


def _record(model, layer: int, values: dict[str, dict[str, Tensor]], deltas: dict[str, Tensor], keep,
            want: dict[str, frozenset[str]], ctx: AttnContext) -> LayerRecord:
    """The captured values of one layer at the kept positions (a cross-attention's keys and values are over the
    source's positions, kept whole). Scores and a pattern the attention did not form are given on read from its
    q and k (kept only where wanted) over every key."""
    attn_absent, mlp_absent = absent_fields(model.config, layer)
    block = model.blocks[layer]
    attn = _attention_kept(block.attn, values.get("attn", {}), want.get("attn", frozenset()), keep, ctx)
    mlp = {name: keep(t) for name, t in values.get("mlp", {}).items()}
    cross = None
    if "cross" in values:
        kept = _attention_kept(block.cross, values["cross"], want.get("cross", frozenset()), keep, ctx)
        cross = CrossRecord(layer, kept, attn_absent, same_fields(model.config, cross=True))
    attn_record = AttnRecord(layer, attn, attn_absent, same_fields(model.config))
    return LayerRecord(attn_record, MLPRecord(layer, mlp, mlp_absent), cross,
                       {part: keep(delta) for part, delta in deltas.items()})


def _attention_kept(attention, values: dict[str, Tensor], want: frozenset[str], keep,
                    ctx: AttnContext) -> dict[str, Tensor | OnRead]:
    """An attention's values at the kept positions: scores and pattern [batch head pos key_pos] along their third
    axis, a cross-attention's keys and values (the source's positions) whole; the scores and pattern the forward
    did not form, given on read (ScoreInputs) from the kept queries and every key."""
    source = ("k", "v", "k_proj") if attention.cross else ()
    by_query = ("scores", "pattern")
    kept = {name: t if name in source else keep(t, axis=2) if name in by_query else keep(t)
            for name, t in values.items()}
    given = [name for name in by_query if name in want and name not in values]
    if given:
        inputs = ScoreInputs.of(attention, kept["q"].transpose(1, 2), values["k"].transpose(1, 2), ctx, rows=keep)
        kept.update(inputs.on_read(given))
        wanted = want | {attention.same[name] for name in want & attention.same.keys()}
        kept = {name: value for name, value in kept.items() if name not in {"q", "k"} - wanted}
    return kept


def _unembed(model, resid: Tensor, tokens: Tokens, logits_at: LogitsAt) -> tuple:
    """(logits or None without a head, the final norm's scale, the logits before a final soft cap or None
    without one, the final hidden state)."""
    readout = model.readout
    normalized, final_scale = readout.normalize(resid)
    index = logit_index(logits_at, tokens)
    if index is not None:
        normalized = normalized.gather(1, index[..., None].expand(-1, -1, normalized.shape[-1]))
    if model.unembed is None:
        return None, final_scale, None, normalized
    uncapped = readout.unembed.raw(normalized if model.mlm_head is None else model.mlm_head(normalized))
    logits = readout.unembed.cap(uncapped)
    return logits, final_scale, (uncapped if readout.unembed.softcap is not None else None), normalized


def _check_finite(model, logits, hidden, tokens, edits, start, resid, ctx, logits_at) -> None:
    # The hidden state is d_vocab / d_model times smaller than the logits; in float32 finite hidden states and
    # weights give finite logits, while half precision can overflow in the unembedding itself.
    # all_finite sums (one pass); isfinite would build masks of the logits' size (43 GB for Gemma 3 at 32x1024).
    half = model.dtype in (torch.float16, torch.bfloat16)
    if all_finite(hidden) and (logits is None or not half or all_finite(logits)):
        return
    where = first_nonfinite(model, tokens, edits, start, resid, ctx)
    advice = (f"Load the model with {param('dtype', torch.float32)} (or bfloat16 if this was float16)." if half else
              "Check the interventions' values (an Add or Replace of a NaN or a huge value) and the weights.")
    raise ResidError(f"The forward pass in {str(model.dtype).removeprefix('torch.')} produced NaN or infinite values; "
                     f"the first non-finite site is {where}. {advice}"
                     f"{python_only(' (Transformer.run(..., check_finite=False) returns the values as they are.)')}")


def first_nonfinite(model, tokens: Tokens, edits: dict, start: int = 0, resid: Tensor | None = None,
                    ctx: AttnContext | None = None) -> str:
    """The label of the first site, in stream order, whose value is not finite (the pass run again with every
    write recorded); "the logits" if every site is finite (an overflow in the head)."""
    capture = Capture(attn={"out"}, mlp={"out"}, cross={"out"})
    again = forward(model, tokens, edits, capture, lambda t, axis=1: t, start=start, resid=resid, ctx=ctx, check=False)
    checks = [(name, write) for name, write in again.embeddings.items()]
    if resid is not None:
        checks.append((f"{Site(start, 'resid_pre').label} (the residual given)", resid))
    for record in again.records:
        layer, deltas = record.attn.layer, record.deltas
        order = [("resid_pre", deltas.get("resid_pre")), ("attn", record.attn.out),
                 ("resid_mid", deltas.get("resid_mid")),
                 ("cross", record.cross and record.cross.out), ("resid_cross", deltas.get("resid_cross")),
                 ("mlp", record.mlp.out), ("resid_post", deltas.get("resid_post"))]
        checks += [(Site(layer, name).label, value) for name, value in order if value is not None]
    for label, value in checks:
        if not bool(torch.isfinite(value).all()):
            return label
    return "the final norm or the head (every write is finite)"
