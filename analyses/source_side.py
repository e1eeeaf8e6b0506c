"""The decoder's logit of an encoder-decoder model decomposed exactly into decoder-side and source-side
components: direct attribution (resid.analyses.attribution) with every cross-attention head's row split by
the encoder component whose write it read.

With the cross-attention patterns frozen, and the encoder's final norm scale frozen (T5 has one; Marian and
the original Transformer end on a post-LN block, whose norms the encoder stream's components are already
carried through), a cross head's output is linear in the encoder's final hidden state (the memory), which is
the sum of the encoder stream's components:

    memory[s]         = sum over encoder components c of m_c[s]   (+ the final norm's bias, if it has one)
    head h at t       = sum_s pattern[h, t, s] (memory[s] W_V[h] + b_V[h]) W_O[h]
    row (h, c)        = sum_s pattern[h, t, s] m_c[s] W_V[h] W_O[h] . u'    (u': the logit direction there)

so each decoder cross head gets one row per encoder component (`source` column: "encoder.embed",
"encoder.layers[k].attn", "encoder.layers[k].mlp", post-LN norm biases, ...), one for its value bias
("b_V") and one for the encoder final norm's bias ("encoder.final_bias", LayerNorm only). The rows of a
head sum to its row in attribution.direct, and all rows to the logit, exactly (up to float rounding).

    df = source_side.direct(model, target_prefixes, source=sources, targets=" Haus")
    df.groupby("source")["value"].sum()       # what each encoder component adds, through every cross head

The decoder side is as in attribution.direct at `level` ("sublayer" or "head"); the source side is per encoder
sublayer (the encoder stream's components).
"""

import dataclasses
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from resid.analyses.attribution import capture_for, meta_columns
from resid.analyses.checks import check_choice, renamed
from resid.analyses.contributions import Contributions, contributions, frame
from resid.analyses.inputs import batch_size_for, check_sources, decoder_of, prediction_positions
from resid.analyses.inputs import prompts as as_prompts
from resid.analyses.io import provenance
from resid.analyses.vocab import Token, decode_ids, token_ids
from resid.batching import run_batched
from resid.capture import Capture
from resid.errors import ResidError
from resid.model import Inputs, Transformer
from resid.readout import Direction
from resid.selection import Padded
from resid.seq2seq import EncoderDecoder
from resid.sites import Site

LEVELS = ("sublayer", "head")


@torch.no_grad()
def direct(
    model: Transformer | EncoderDecoder,
    prompts: Inputs,
    source: Inputs,
    targets: Token | Sequence[Token | None] | None = None,
    baselines: Token | Sequence[Token] | None = None,
    level: str = "sublayer",
    position: int | None = None,
    batch_size: int | str = "auto",
    *,
    target: Token | Sequence[Token | None] | None = None,
    baseline: Token | Sequence[Token] | None = None,
    pos: int | None = None,
) -> pd.DataFrame:
    """Direct attribution of the decoder's logit of `targets` (minus `baselines`) at prompt-relative `position`
    (default the last), with every cross-attention head split by source-side component. prompts: the decoder's
    target prefixes; source: one per prompt. The columns of attribution.direct plus `source` (the encoder component
    a cross head's row reads, <NA> for decoder-side rows). target, baseline, pos: the old names of targets,
    baselines, position (deprecated)."""
    targets = renamed("targets", targets, "target", target)
    baselines = renamed("baselines", baselines, "baseline", baseline)
    position = renamed("position", position, "pos", pos)
    if not isinstance(model, EncoderDecoder):
        raise ResidError(f"source_side.direct splits cross-attention by source; {model.name} has none: use "
                         "attribution.direct.")
    check_choice(level, "level", LEVELS)
    decoder, sources = decoder_of(model, source)
    given = as_prompts(decoder, prompts)
    n = len(given)
    check_sources(sources, n)
    positions = prediction_positions(decoder, given, position, mask=False)
    target_ids = None if targets is None else token_ids(decoder, targets, n, "target", optional=True)
    baseline_ids = None if baselines is None else token_ids(decoder, baselines, n, "baseline")

    def run_chunk(chunk):
        return _attribute(model, given, sources.prompts, chunk, target_ids, baseline_ids, level, positions)

    chunks = run_batched(list(range(n)), run_chunk, batch_size_for(decoder, given.tokens, batch_size))
    df = pd.concat([table for _, table in chunks], ignore_index=True)
    df.attrs["provenance"] = provenance.describe(
        decoder, "source_side.direct", {"level": level, "position": -1 if position is None else position},
        given.record(), targets, baselines)
    return df


def _attribute(model: EncoderDecoder, given, source_prompts, chunk, targets, baselines, level, positions):
    decoder = model.decoder
    tokens = given.batch(chunk)
    encoded = model.encode(source_prompts.batch(chunk), capture=Capture())
    sites, pieces = encoded.stream.components()  # [c batch src d_model], summing to the encoder's final()
    memory_pieces, labels = _memory_pieces(model, encoded, pieces.float(), sites)
    index = tokens.padded_index([[positions[i]] for i in chunk])
    capture = capture_for(decoder, level, [positions[i] for i in chunk])
    capture = Capture(positions=capture.positions, attn=capture.attn, mlp=capture.mlp, cross={"z", "pattern"})
    run = model.decoder.run(tokens, capture=capture, logits_at=Padded(index), memory=model.memory(encoded))
    logits = run.logits[:, 0].float()
    top = logits.argmax(-1).tolist()
    target_list = [top[b] if targets is None or targets[i] is None else targets[i] for b, i in enumerate(chunk)]
    baseline_list = None if baselines is None else [baselines[i] for i in chunk]
    stream = run.stream
    at_pos = decoder.readout.logit_direction(target_list, stream.final_norm_scale[:, 0], baseline_list,
                                             run.hidden[:, 0])
    direction = Direction(at_pos.vector[:, None], at_pos.bias)

    def cross(layer: int, written, into: Direction) -> list[Contributions]:
        return _split_heads(decoder.blocks[layer].cross, layer, written, into, memory_pieces, labels)

    groups = contributions(decoder, stream, direction, level, cross=cross)
    groups.append(Contributions([Site(None, "final_bias")], direction.bias[:, None]))
    rows = torch.arange(len(chunk), device=logits.device)
    actual = logits[rows, torch.tensor(target_list, device=logits.device)]
    if baseline_list is not None:
        actual = actual - logits[rows, torch.tensor(baseline_list, device=logits.device)]
    baseline_names = None if baseline_list is None else list(decode_ids(decoder, np.array(baseline_list)))
    meta = meta_columns(decoder, tokens, chunk, stream.captured, list(decode_ids(decoder, np.array(target_list))),
                        target_list, baseline_names, baseline_list)
    table = frame(meta, groups, actual)
    per_row = [s for g in groups for s in (g.sources if g.sources is not None else [None] * len(g.sites))]
    table.insert(table.columns.get_loc("value"), "source", pd.array(np.tile(np.asarray(per_row, dtype=object),
                                                                           len(chunk)), dtype="string"))
    return table


def _memory_pieces(model: EncoderDecoder, encoded, pieces, sites: list[Site]):
    """The memory's components [c batch src d_model] (float32): the encoder stream's, through its final norm with
    the scale frozen (plus the norm's bias as a piece of its own), with the labels of their encoder sites."""
    labels = [dataclasses.replace(site, stack="encoder").label for site in sites]
    scale = encoded.stream.final_norm_scale.float()  # [batch src 1]
    pieces, constant = model.encoder.readout.frozen_pieces(pieces, scale)
    if constant is not None:
        bias = Site(None, "final_bias", stack="encoder").label
        pieces, labels = torch.cat([pieces, constant.expand_as(pieces[0])[None]]), [*labels, bias]
    return pieces, labels


def _split_heads(attn, layer: int, written, into: Direction, memory_pieces, labels) -> list[Contributions]:
    """One row per (cross head, memory component), and one per head for its value bias."""
    w = into.through(attn.W_O)  # [batch pos head d_head]: what z[h] is read with
    rule = attn.score_rule
    w_v = rule.repeat_kv(attn.W_V.float(), dim=0)  # [head d_model d_head]
    r = torch.einsum("bthe,hde->bthd", w, w_v)  # what memory W_V[h] is read with, per query position
    pattern = written.pattern.float()  # [batch head pos src]
    reads = torch.einsum("bhts,bthd->bhsd", pattern, r)
    values = torch.einsum("cbsd,bhsd->bhc", memory_pieces, reads)  # [batch head c]
    n_heads, n_pieces = values.shape[1], values.shape[2]
    groups: list[Contributions] = []
    for head in range(n_heads):
        site = Site(layer, "cross", head=head)
        groups.append(Contributions([site] * n_pieces, values[:, head], sources=labels))
    if attn.b_V is not None:
        b_v = rule.repeat_kv(attn.b_V.float(), dim=0)  # [head d_head]
        biases = torch.einsum("bhts,bthe,he->bh", pattern, w, b_v)
        groups += [Contributions([Site(layer, "cross", head=h)], biases[:, h : h + 1], sources=["b_V"])
                   for h in range(n_heads)]
    return groups
