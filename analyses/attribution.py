"""Direct logit attribution: how much each write into the residual stream adds to one logit (difference).

With the final norm's scale frozen from the forward pass (resid.readout), the logit of `target` (minus
`baseline`) at a position is linear in the final residual, which is the sum of every write. So

    logit = sum over components c of (c . u') + bias term

holds exactly, component by component, at three levels of detail:

    sublayer   embed, pos_embed (learned positions only), layers[l].attn, layers[l].mlp (the writes)
    head       attention split into heads, z[h] @ (W_O[h] @ u'), plus the layer's output bias b_O
    neuron     heads as above, and each MLP split into neurons, post[i] * (W_out[i] . u'), plus b_out

Mixture-of-experts MLPs (Mixtral) are split by expert at level "head", weight_e * (post_e . (W_out[e] @ u'))
(`layers[l].mlp.expert[e]`), and by (expert, neuron) at level "neuron", weight_e * post_e[i] * (W_out[e, i] . u'),
with weight_e the token's renormalized router weight (0 for experts it was not routed to).

and one `final_bias` row: the final norm's bias and the unembedding bias, projected (zero for models with
neither). Heads and neurons are computed projected, never materializing [batch pos head d_model], and only
the attributed position is captured. Projections run in float32 whatever the model dtype.

Post-norms (Gemma 2/3, OLMo 2): a sublayer's write is its output through a norm; with that norm's scale frozen
too, the direction is pulled back through it (Norm.pull_back), so heads and neurons still sum to the write
(a LayerNorm post-norm's bias is its own `post_norm_bias` row). A final soft cap (Gemma 2) is not linear: the
rows decompose the logit before the cap, `logit` is that value, `logit_capped` the model's capped one, and
df.attrs["notes"] says so.

A target can also be a `Probe`: any linear read-out of the final hidden state (a probe's weights, a difference
of embeddings, a steering direction), value = final_hidden . vector + bias, where final_hidden is the final
norm's output (what the unembedding reads; transformers' last_hidden_state). It decomposes the same way, at one
position or mean-pooled over each prompt's tokens (a sentence embedding's read-out; resid.analyses.similarity
decomposes the similarity of two sentences' embeddings with it).

Post-LN models (BERT) norm the residual after every write: the direction is pulled back through each norm with
its scale frozen, layer by layer, and each norm's bias is a row (embed_norm_bias, layers[l].attn.resid_norm_bias,
...). BERT's masked-LM head is frozen at the run's hidden state (resid.components.head); its biases join
final_bias. For masked-LM models `pos` defaults to each prompt's [MASK].
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from resid.analyses import site_words
from resid.analyses.checks import check_choice, renamed
from resid.analyses.contributions import Contributions, check_probe, contributions, frame, probe_frame, read_out
from resid.analyses.features import attribution as features
from resid.analyses.inputs import (
    batch_size_for,
    check_sources,
    decoder_of,
    input_tokens,
    prediction_positions,
)
from resid.analyses.inputs import (
    prompts as as_prompts,
)
from resid.analyses.io import provenance
from resid.analyses.vocab import Token, as_list, decode_ids, spacing_notes, token_ids
from resid.batching import run_batched
from resid.capture import Capture
from resid.model import Inputs, Memory, Transformer
from resid.readout import Direction
from resid.selection import Padded
from resid.seq2seq import EncoderDecoder
from resid.sites import Site
from resid.tokenizer import Tokens


@dataclass(frozen=True)
class Probe:
    """A direction target for `direct`: value = final_hidden . vector + bias at the attributed position, with
    final_hidden the final norm's output (the unembedding's input). vector: [d_model] for every prompt, or
    [n_prompts d_model], one per prompt. In the frame, `target` is `name`, `target_id` is -1 and the column
    `readout` (in place of `logit`) is the probe's value, which the rows sum to."""

    vector: Tensor
    bias: float = 0.0
    name: str = "probe"
    # "mean": read out the mean of final_hidden over each prompt's tokens (mean pooling, as sentence-transformers
    # embeds a sentence) instead of one position; `pos` is then -1 and `token` "<mean>" in the frame
    pool: Literal["mean"] | None = None
    normalize: bool = False  # pooled: divide by the pooled vector's length, frozen (cosine with a unit vector)


Level = Literal["sublayer", "head", "neuron"]
LEVELS: tuple[str, ...] = ("sublayer", "head", "neuron")
# One row per (prompt, component). site: the component's resid.Site label ("layers[3].attn.head[5]", "embed",
# "layers[3].mlp.b_out", "final_bias", ...; the same labels as ablation and patching tables); value: its direct
# contribution; logit: the model's own logit (difference), which each prompt's values sum to; layer/head/kv_head/
# expert/neuron are <NA> where they do not apply (expert: mixture-of-experts MLPs only).
COLUMNS = ("prompt_idx", "pos", "token", "target", "target_id", "baseline", "baseline_id", "site", *site_words.COLUMNS,
           "value", "logit")


@torch.no_grad()
def direct(
    model: Transformer | EncoderDecoder,
    prompts: Inputs,
    targets: Token | Sequence[Token | None] | Probe | None = None,
    baselines: Token | Sequence[Token] | None = None,
    level: Level = "sublayer",
    position: int | None = None,
    batch_size: int | str = "auto",
    source: Inputs | None = None,
    dictionaries: Sequence = (),
    *,
    target: Token | Sequence[Token | None] | Probe | None = None,
    baseline: Token | Sequence[Token] | None = None,
    pos: int | None = None,
) -> pd.DataFrame:
    """Direct attribution of the logit of `targets` (minus `baselines`) at prompt-relative `position` (default: the
    last token; for masked-LM models, each prompt's [MASK]). Encoder-decoder models (resid.EncoderDecoder):
    the prompts are the decoder's target prefixes and `source` their sources, one per prompt; the rows are the
    decoder stream's components, cross-attention heads included (`layers[l].cross.head[h]`).

    prompts: texts, resid.Tokens or token ids. targets / baselines: one token (string or id) for all prompts,
    or one per prompt; targets=None takes the model's top prediction at `position` (for every prompt, or, in a
    list, for the prompts whose entry is None); a `Probe` attributes its read-out instead (embedding models
    take only Probes). One row per (prompt, component), in logit units, with the columns of COLUMNS.
    `df.attrs["notes"]`: hints on the targets as given (resid.analyses.vocab.spacing_hint). dictionaries: learned
    dictionaries (resid.dictionaries) whose reconstructed writes are split into one row per active feature plus
    b_dec / skip / error rows, with `feature` and `activation` columns (resid.analyses.features.attribution).
    target, baseline, pos: the old names of targets, baselines, position (deprecated)."""
    targets = renamed("targets", targets, "target", target)
    baselines = renamed("baselines", baselines, "baseline", baseline)
    position = renamed("position", position, "pos", pos)
    check_choice(level, "level", LEVELS)
    model, sources = decoder_of(model, source)
    given = as_prompts(model, prompts)
    n = len(given)
    check_sources(sources, n)
    memory = (lambda chunk: None) if sources is None else sources.memory  # noqa: E731
    if isinstance(targets, Probe):
        check_probe(model, targets, baselines, n, dictionaries)
        positions = None if targets.pool else prediction_positions(model, given, position, mask=False)
        run_chunk = lambda chunk: _attribute_probe(  # noqa: E731
            model, given.batch(chunk), chunk, targets, level, positions and [positions[i] for i in chunk],
            memory(chunk)
        )
        shown = ("mean" if targets.pool else -1) if position is None else position
        return _collect(model, given, run_chunk, batch_size, level, shown, targets.name, None)
    if model.config.head == "none":
        model.readout.unembed  # noqa: B018 -- raises: an embedding model has no token logits; it says what to pass
    positions = prediction_positions(model, given, position, mask=model.config.head == "mlm")
    target_ids = None if targets is None else token_ids(model, targets, n, "target", optional=True)
    baseline_ids = None if baselines is None else token_ids(model, baselines, n, "baseline")
    as_given = as_list(targets, n)
    run_chunk = lambda chunk: _attribute(  # noqa: E731
        model, given.batch(chunk), chunk, target_ids, as_given, baseline_ids, level, [positions[i] for i in chunk],
        memory(chunk), features.attributed_dictionaries(model, dictionaries),
    )
    shown = ("[MASK]" if model.config.head == "mlm" else -1) if position is None else position
    return _collect(model, given, run_chunk, batch_size, level, shown, targets, baselines)


def _collect(model, given, run_chunk, batch_size, level: str, pos, target, baseline) -> pd.DataFrame:
    """Run the chunks (batched, backing off on out-of-memory) and join their frames, with provenance and notes."""
    chunks = list(run_batched(list(range(len(given))), run_chunk, batch_size_for(model, given.tokens, batch_size)))
    df = pd.concat([frame for _, (frame, _) in chunks], ignore_index=True)
    df.attrs["provenance"] = provenance.describe(
        model, "attribution.direct", {"level": level, "position": pos}, given.record(), target, baseline
    )
    df.attrs["notes"] = [note for _, (_, notes) in chunks for note in notes]
    return df


def capture_for(model: Transformer, level: str, positions: list[int] | None) -> Capture:
    """What a chunk records at each prompt's position (every position for None): heads need z, neurons post
    (and the post-norm scale, the router weights); sublayers their write."""
    post = {"post_norm_scale"} if model.config.post_norms else set()
    # experts (level "head") and neurons need post and the router weights of a mixture of experts
    split = level == "neuron" or (level == "head" and model.config.n_experts > 0)
    experts = {"expert_weights"} if model.config.n_experts else set()
    out = {"out"} if level == "sublayer" else set()
    attn = {"z", *post, *out} if level != "sublayer" else {"out"}
    if split and level == "head" and model.config.n_dense_layers:
        out = {"out"}  # DeepSeek's dense first layers: at the head level, their MLP is one row, its write
    return Capture(
        positions=None if positions is None else [[p] for p in positions],
        attn=attn,
        mlp={"post", *experts, *post, *out} if split else {"out"},
        cross=attn,  # decoders' cross-attention, read like self-attention
    )


def meta_columns(model, tokens: Tokens, chunk, index, targets, target_ids, baselines, baseline_ids) -> dict:
    """The per-prompt columns of a chunk's frame (resid.analyses.contributions.frame repeats them per component)."""
    none = [None] * len(chunk)
    return {
        "prompt_idx": list(chunk),
        "pos": tokens.relative(index)[:, 0].tolist(),
        "token": list(input_tokens(model, tokens, index)[:, 0]),
        "target": targets,
        "target_id": target_ids,
        "baseline": none if baselines is None else baselines,
        "baseline_id": pd.array(none if baseline_ids is None else baseline_ids, dtype="Int64"),
    }


def _attribute_probe(
    model: Transformer,
    tokens: Tokens,
    chunk: Sequence[int],
    probe: Probe,
    level: str,
    positions: list[int] | None,
    memory: Memory | None = None,
) -> tuple[pd.DataFrame, list[str]]:
    """A Probe's read-out of the final hidden state, at each prompt's position or mean-pooled over its tokens."""
    index = None if positions is None else tokens.padded_index([[p] for p in positions])
    at = None if index is None else Padded(index)
    run = model.run(tokens, capture=capture_for(model, level, positions), logits_at=at, memory=memory)
    vector = probe.vector.to(model.device).float()
    vector = vector.expand(len(chunk), -1) if vector.ndim == 1 else vector[torch.as_tensor(list(chunk))]
    bias = torch.full((len(chunk),), float(probe.bias), device=model.device)
    pooled = tokens.attention_mask if probe.pool == "mean" else None
    direction, actual = read_out(model, run, vector, bias, pooled, probe.normalize)
    if index is None:
        index = tokens.last_positions()[:, None]
    meta = meta_columns(model, tokens, chunk, index, [probe.name] * len(chunk), [-1] * len(chunk), None, None)
    if probe.pool is not None:
        meta["pos"], meta["token"] = [-1] * len(chunk), [f"<{probe.pool}>"] * len(chunk)
    return probe_frame(model, run, direction, actual, meta, level), []


def metric_name(df: pd.DataFrame) -> str:
    """What the rows of `df` attribute, e.g. "logit(' Mary') - logit(' John')" ("the target" when the
    prompts have different ones)."""
    targets = df["target"].unique()
    if (df["target_id"] == -1).all():  # Probe targets
        return f"probe {targets[0]!r}" if len(targets) == 1 else "the probes"
    target = repr(targets[0]) if len(targets) == 1 else "the target"
    baselines = df["baseline"].dropna().unique()
    if len(baselines) == 1:
        return f"logit({target}) - logit({baselines[0]!r})"
    return f"logit({target})" + (" - logit(baseline)" if len(baselines) else "")


def top_components(df: pd.DataFrame, n: int) -> pd.DataFrame:
    """The n rows with the largest |value|, largest first."""
    return df.reindex(df["value"].abs().sort_values(ascending=False).index).head(n)


def _attribute(
    model: Transformer,
    tokens: Tokens,
    chunk: Sequence[int],
    targets: list[int | None] | None,
    as_given: list[Token | None] | None,
    baselines: list[int] | None,
    level: str,
    positions: list[int],
    memory: Memory | None = None,
    dictionaries: Sequence = (),
) -> tuple[pd.DataFrame, list[str]]:
    index = tokens.padded_index([[p] for p in positions])  # [batch 1]
    capture = features.capture_with(capture_for(model, level, positions), model) if dictionaries else capture_for(
        model, level, positions)
    run = model.run(tokens, capture=capture, logits_at=Padded(index), memory=memory, dictionaries=dictionaries)
    capped = run.uncapped_logits is not None
    logits = (run.uncapped_logits if capped else run.logits)[:, 0].float()
    top = logits.argmax(-1).tolist()
    wanted = [None] * len(chunk) if targets is None else [targets[i] for i in chunk]
    target_list = [top[b] if t is None else t for b, t in enumerate(wanted)]  # None: the top prediction
    baseline_list = None if baselines is None else [baselines[i] for i in chunk]
    stream = run.stream
    at_pos = model.readout.logit_direction(target_list, stream.final_norm_scale[:, 0], baseline_list, run.hidden[:, 0])
    direction = Direction(at_pos.vector[:, None], at_pos.bias)
    rows = torch.arange(len(chunk), device=model.device)
    def value(of: Tensor) -> Tensor:
        picked = of[rows, torch.tensor(target_list, device=model.device)]
        if baseline_list is not None:
            picked = picked - of[rows, torch.tensor(baseline_list, device=model.device)]
        return picked

    actual = value(logits)
    groups = contributions(model, stream, direction, level)
    groups.append(Contributions([Site(None, "final_bias")], direction.bias[:, None]))
    index = stream.captured  # [batch 1] padded index of `pos`
    baseline_names = None if baseline_list is None else list(decode_ids(model, np.array(baseline_list)))
    target_names = list(decode_ids(model, np.array(target_list)))
    meta = meta_columns(model, tokens, chunk, index, target_names, target_list, baseline_names, baseline_list)
    if dictionaries:
        groups, acts = features.feature_groups(model, run, direction, groups)
    table, notes = frame(meta, groups, actual), spacing_notes(model, as_given, logits, chunk)
    table = features.with_features(table, groups, acts) if dictionaries else table
    if capped:
        capped_values = value(run.logits[:, 0].float()).double().cpu().numpy()
        table["logit_capped"] = np.repeat(capped_values, len(table) // len(chunk))
        notes = notes + [
            f"{model.name} soft-caps its logits (cap * tanh(logit / cap), cap={model.config.final_softcap}): the rows "
            "decompose the logit before the cap (column `logit`); the model's capped value is `logit_capped`."
        ]
    return table, notes
