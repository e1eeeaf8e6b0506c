"""Direct logit attribution: how much each write into the residual stream adds to one logit (difference).

With the final norm's scale frozen from the forward pass (resid.readout), the logit of `target` (minus
`baseline`) at a position is linear in the final residual, which is the sum of every write. So

    logit = sum over components c of (c . u') + bias term

holds exactly, component by component, at three levels of detail:

    sublayer   embed, pos_embed (learned positions only), layers[l].attn.out, layers[l].mlp.out
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
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from analyses.checks import check_choice
from analyses.inputs import batch_size_for, input_tokens, prompts as as_prompts
from analyses.io import provenance
from analyses.vocab import Token, as_list, decode_ids, spacing_notes, token_ids
from resid.batching import run_batched
from resid.capture import Capture
from resid.model import Inputs, Transformer
from resid.readout import Direction
from resid.stream import ResidualStream
from resid.tokenizer import Tokens

Level = Literal["sublayer", "head", "neuron"]
LEVELS: tuple[str, ...] = ("sublayer", "head", "neuron")
# One row per (prompt, component). value: the component's direct contribution; logit: the model's own logit
# (difference), which each prompt's values sum to; layer/head/expert/neuron are <NA> where they do not apply
# (expert: mixture-of-experts MLPs only).
COLUMNS = ("prompt_idx", "pos", "token", "target", "target_id", "baseline", "baseline_id", "component", "layer",
           "part", "head", "expert", "neuron", "value", "logit")


@torch.no_grad()
def direct(
    model: Transformer,
    prompts: Inputs,
    target: Token | Sequence[Token | None] | None = None,
    baseline: Token | Sequence[Token] | None = None,
    level: Level = "sublayer",
    pos: int = -1,
    batch_size: int | str = "auto",
) -> pd.DataFrame:
    """Direct attribution of the logit of `target` (minus `baseline`) at prompt position `pos`.

    prompts: texts, resid.Tokens or token ids. target / baseline: one token (string or id) for all prompts,
    or one per prompt; target=None takes the model's top prediction at `pos` (for every prompt, or, in a
    list, for the prompts whose entry is None). One row per (prompt, component), in logit units, with the
    columns of COLUMNS. `df.attrs["notes"]`: hints on the targets as given (analyses.vocab.spacing_hint)."""
    check_choice(level, "level", LEVELS)
    given = as_prompts(model, prompts)
    n = len(given)
    targets = None if target is None else token_ids(model, target, n, "target", optional=True)
    baselines = None if baseline is None else token_ids(model, baseline, n, "baseline")
    given.tokens.padded_index([pos])  # an out-of-range position fails here, before any forward pass
    as_given = as_list(target, n)
    chunks = list(run_batched(
        list(range(n)),
        lambda chunk: _attribute(model, given.batch(chunk), chunk, targets, as_given, baselines, level, pos),
        batch_size_for(model, given.tokens, batch_size),
    ))
    df = pd.concat([frame for _, (frame, _) in chunks], ignore_index=True)
    df.attrs["provenance"] = provenance.describe(
        model, "attribution.direct", {"level": level, "pos": pos}, given.record(), target, baseline
    )
    df.attrs["notes"] = [note for _, (_, notes) in chunks for note in notes]
    return df


def metric_name(df: pd.DataFrame) -> str:
    """What the rows of `df` attribute, e.g. "logit(' Mary') - logit(' John')" ("the target" when the
    prompts have different ones)."""
    targets = df["target"].unique()
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
    pos: int,
) -> tuple[pd.DataFrame, list[str]]:
    post = {"post_norm_scale"} if model.config.post_norms else set()
    # experts (level "head") and neurons need post and the router weights of a mixture of experts
    split = level == "neuron" or (level == "head" and model.config.n_experts > 0)
    experts = {"expert_weights"} if model.config.n_experts else set()
    capture = Capture(  # heads need z, neurons post (and the post-norm scale); sublayers their write; at `pos`
        positions=[pos],
        attn={"z", *post} if level != "sublayer" else {"out"},
        mlp={"post", *experts, *post} if split else {"out"},
    )
    run = model.run(tokens, capture=capture, logits_at=[pos])
    capped = run.uncapped_logits is not None
    logits = (run.uncapped_logits if capped else run.logits)[:, 0].float()
    top = logits.argmax(-1).tolist()
    wanted = [None] * len(chunk) if targets is None else [targets[i] for i in chunk]
    target_list = [top[b] if t is None else t for b, t in enumerate(wanted)]  # None: the top prediction
    baseline_list = None if baselines is None else [baselines[i] for i in chunk]
    stream = run.stream
    direction = model.readout.logit_direction(target_list, stream.final_norm_scale[:, 0], baseline_list)
    rows = torch.arange(len(chunk), device=model.device)
    def value(of: Tensor) -> Tensor:
        picked = of[rows, torch.tensor(target_list, device=model.device)]
        if baseline_list is not None:
            picked = picked - of[rows, torch.tensor(baseline_list, device=model.device)]
        return picked

    actual = value(logits)
    groups = _components(model, stream, direction, level)
    groups.append(_Contributions(["final_bias"], None, "bias", None, None, direction.bias[:, None]))
    index = stream.captured  # [batch 1] padded index of `pos`
    meta = {
        "prompt_idx": list(chunk),
        "pos": (index[:, 0] - tokens.first_positions()).tolist(),
        "token": list(input_tokens(model, tokens, index)[:, 0]),
        "target": list(decode_ids(model, np.array(target_list))),
        "target_id": target_list,
        "baseline": [None] * len(chunk) if baseline_list is None else list(decode_ids(model, np.array(baseline_list))),
        "baseline_id": pd.array([None] * len(chunk) if baseline_list is None else baseline_list, dtype="Int64"),
    }
    frame, notes = _frame(meta, groups, actual), spacing_notes(model, as_given, logits, chunk)
    if capped:
        frame["logit_capped"] = np.repeat(value(run.logits[:, 0].float()).double().cpu().numpy(), len(frame) // len(chunk))
        notes = notes + [
            f"{model.name} soft-caps its logits (cap * tanh(logit / cap), cap={model.config.final_softcap}): the rows "
            "decompose the logit before the cap (column `logit`); the model's capped value is `logit_capped`."
        ]
    return frame, notes


@dataclass(frozen=True)
class _Contributions:
    """A group of components: labels, their layer/part/head/neuron, and their values [batch m]."""

    labels: list[str]
    layer: int | None
    part: str
    heads: np.ndarray | None
    neurons: np.ndarray | None
    values: Float[Tensor, "batch m"]
    experts: np.ndarray | None = None  # mixture-of-experts MLPs


def _components(model: Transformer, stream: ResidualStream, direction: Direction, level: str) -> list[_Contributions]:
    """Every component's contribution at the one captured position (the stream's pos axis has length 1)."""

    def dot(write: Tensor) -> Tensor:  # [batch 1 d_model] -> [batch 1]
        return direction.project(write[:, 0])[:, None]

    groups = [_Contributions(["embed"], None, "embed", None, None, dot(stream.embed))]
    if stream.pos_embed is not None:
        groups.append(_Contributions(["pos_embed"], None, "embed", None, None, dot(stream.pos_embed)))
    for layer, record in enumerate(stream.layers):
        block = model.blocks[layer]
        attn, mlp = block.attn, block.mlp
        if level == "sublayer":
            groups.append(_Contributions([f"layers[{layer}].attn.out"], layer, "attn", None, None, dot(record.attn.out)))
        else:
            into = _through_post_norm(block.ln_attn_post, record.attn, direction, layer, "attn", groups)
            # z[h] . (W_O[h] @ u'): W_O pulled back onto the direction first, a [batch head d_head] tensor.
            heads = (record.attn.z[:, 0].float() * into.through(attn.W_O)).sum(-1)
            n_heads = heads.shape[1]
            labels = [f"layers[{layer}].attn.head[{h}]" for h in range(n_heads)]
            groups.append(_Contributions(labels, layer, "attn", np.arange(n_heads), None, heads))
            if attn.b_O is not None:
                groups.append(_Contributions(
                    [f"layers[{layer}].attn.b_O"], layer, "attn", None, None, into.through(attn.b_O)[:, None]
                ))
        moe = model.config.n_experts > 0
        if level == "sublayer" or (level == "head" and not moe):
            groups.append(_Contributions([f"layers[{layer}].mlp.out"], layer, "mlp", None, None, dot(record.mlp.out)))
            continue
        into = _through_post_norm(block.ln_mlp_post, record.mlp, direction, layer, "mlp", groups)
        if moe:
            groups.append(_experts(layer, record.mlp.post, record.mlp.expert_weights, mlp.W_out, into, level))
            continue
        # post[i] * (W_out[i] . u')
        neurons = record.mlp.post[:, 0].float() * into.through(mlp.W_out)
        d_mlp = neurons.shape[1]
        labels = [f"layers[{layer}].mlp.neuron[{i}]" for i in range(d_mlp)]
        groups.append(_Contributions(labels, layer, "mlp", None, np.arange(d_mlp), neurons))
        if mlp.b_out is not None:
            groups.append(_Contributions(
                [f"layers[{layer}].mlp.b_out"], layer, "mlp", None, None, into.through(mlp.b_out)[:, None]
            ))
    return groups


def _experts(
    layer: int,
    post: Float[Tensor, "batch 1 expert d_mlp"],
    weights: Float[Tensor, "batch 1 expert"],
    w_out: Float[Tensor, "expert d_mlp d_model"],
    into: Direction,
    level: str,
) -> _Contributions:
    """A mixture of experts' rows: one per expert (level "head"), weight_e * (post_e . (W_out[e] @ u')), or one per
    (expert, neuron) (level "neuron"), weight_e * post_e[i] * (W_out[e, i] . u'). W_out is pulled back onto the
    direction first, a [batch expert d_mlp] tensor."""
    per_neuron = post[:, 0].float() * into.through(w_out)
    weight = weights[:, 0].float()
    n_experts, d_mlp = per_neuron.shape[1:]
    if level == "head":
        labels = [f"layers[{layer}].mlp.expert[{e}]" for e in range(n_experts)]
        return _Contributions(labels, layer, "mlp", None, None, weight * per_neuron.sum(-1), np.arange(n_experts))
    labels = [f"layers[{layer}].mlp.expert[{e}].neuron[{i}]" for e in range(n_experts) for i in range(d_mlp)]
    values = (weight[..., None] * per_neuron).flatten(1)
    neurons, experts = np.tile(np.arange(d_mlp), n_experts), np.repeat(np.arange(n_experts), d_mlp)
    return _Contributions(labels, layer, "mlp", None, neurons, values, experts)


def _through_post_norm(norm, record, direction: Direction, layer: int, part: str, groups: list) -> Direction:
    """The direction as the sublayer's output (before its post-norm) reads it: pulled back through the
    post-norm with its scale frozen. A LayerNorm post-norm's bias becomes its own row. Without a post-norm,
    the direction itself."""
    if norm is None:
        return direction
    pulled = Direction(norm.pull_back(direction.vector, record.post_norm_scale[:, 0]), direction.bias)
    if norm.b is not None:
        groups.append(_Contributions(
            [f"layers[{layer}].{part}.post_norm_bias"], layer, part, None, None, norm.bias_dot(direction.vector)[:, None]
        ))
    return pulled


def _frame(meta: dict, blocks: list[_Contributions], actual: Float[Tensor, "batch"]) -> pd.DataFrame:
    """Long format (COLUMNS): every prompt of the chunk times every component."""

    def per_component(block: _Contributions, values, fill) -> np.ndarray:
        m = len(block.labels)
        return np.full(m, fill, dtype=object) if values is None else np.asarray(values, dtype=object)

    labels = np.concatenate([np.asarray(b.labels, dtype=object) for b in blocks])
    layer = np.concatenate([per_component(b, None, b.layer) for b in blocks])
    part = np.concatenate([per_component(b, None, b.part) for b in blocks])
    head = np.concatenate([per_component(b, b.heads, None) for b in blocks])
    expert = np.concatenate([per_component(b, b.experts, None) for b in blocks])
    neuron = np.concatenate([per_component(b, b.neurons, None) for b in blocks])
    values = torch.cat([b.values for b in blocks], dim=1).double().cpu().numpy()  # [batch m]
    batch, m = values.shape
    df = pd.DataFrame({name: np.repeat(np.asarray(col, dtype=object), m) for name, col in meta.items()})
    for name in ("prompt_idx", "pos", "target_id"):
        df[name] = df[name].astype("int64")
    df["baseline_id"] = df["baseline_id"].astype("Int64")
    df["target"] = df["target"].astype(str)
    df["token"] = df["token"].astype(str)
    df["component"] = np.tile(labels, batch).astype(str)
    df["layer"] = pd.array(np.tile(layer, batch), dtype="Int64")
    df["part"] = np.tile(part, batch).astype(str)
    df["head"] = pd.array(np.tile(head, batch), dtype="Int64")
    df["expert"] = pd.array(np.tile(expert, batch), dtype="Int64")
    df["neuron"] = pd.array(np.tile(neuron, batch), dtype="Int64")
    df["value"] = values.reshape(-1)
    df["logit"] = np.repeat(actual.double().cpu().numpy(), m)
    return df
