"""Sub-updates (Geva et al. 2022): an MLP's output at one token split into its neurons' m_i * v_i, ranked by
size and by direct contribution to a target logit. See resid.analyses.neurons for the glossary.

Post-norms (Gemma 2/3, OLMo 2): the MLP's write is the post-norm of its output, s * linear(sum_i m_i v_i +
b_out) (+ its bias), with s the post-norm's input-dependent scale. Frozen at the run's value (post_norm_scale),
the norm is linear, so each neuron writes s * linear(m_i v_i) into the residual: that is the sub-update ranked
here, and the sub-updates (with s * linear(b_out) and the norm's bias) sum to the write.

Mixture of experts (Mixtral): neuron i of expert e writes w_e * m_{e,i} * v_{e,i}, w_e the token's router weight
(0 for experts it was not routed to); every (expert, neuron) of the layer is ranked together and the rows get an
`expert` column.
"""

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from resid.analyses.checks import check_k, has_experts, renamed, select_layers
from resid.analyses.inputs import prompts as as_prompts
from resid.analyses.io.provenance import describe
from resid.analyses.neurons.selection import site_column
from resid.analyses.vocab import decode_ids, single_token_id
from resid.capture import Capture
from resid.errors import ResidError
from resid.model import Inputs, Transformer

RANKINGS = ("magnitude", "target")


def sub_updates(
    model: Transformer,
    prompt: Inputs,
    position: int = -1,
    layers: int | Sequence[int] | None = None,
    k: int = 10,
    target: str | int | None = None,
    value_k: int = 5,
    *,
    pos: int | None = None,
) -> pd.DataFrame:
    """The top-k sub-updates m_i * v_i of each layer's MLP at prompt-relative `position` of one prompt (a text, or
    a one-row Tokens or id tensor; see the module docstring). `pos`: the old name of `position` (deprecated).
    target: a single token or id; default the model's top prediction at `position`.

    One row per (layer, ranking, rank), ranking "magnitude" (by |m_i| ||v_i||) or "target" (by the
    contribution to the target's logit, largest first): site (the neuron's Site.label) layer ranking rank neuron
    coefficient value_norm
    magnitude target_contribution promotes (the `value_k` tokens whose logits m_i v_i raises most, through
    the final norm) explained_norm explained_target layer_norm (||U||) layer_target (U . u') pos target_id
    target. With post-norms, value_norm is ||linear_post(v_i)|| (the gain, not the frozen scale s, which
    magnitude includes); with experts, an `expert` column follows `layer`, coefficient is m_{e,i} and
    magnitude includes the router weight w_e."""
    position = renamed("position", position, "pos", pos, default=-1)
    layer_list = select_layers(model, layers)
    experts = model.config.n_experts if has_experts(model, layer_list) else 0  # one kind of MLP (DeepSeek's mix)
    k = check_k(k, "k", model.config.mlp_width(layer_list[0]) * max(1, experts))
    value_k = check_k(value_k, "value_k", model.config.d_vocab)
    given = as_prompts(model, prompt)
    if len(given) != 1:
        raise ResidError(f"sub_updates takes one prompt, got {len(given)}: call it once per prompt.")
    pos = int(given.tokens.relative(given.tokens.padded_index([position]))[0, 0])  # made non-negative
    wanted = {"post"} | ({"post_norm_scale"} if model.config.post_norms else set())
    wanted |= {"expert_weights"} if experts else set()
    capture = Capture(layers=layer_list, positions=[pos], attn=frozenset(), mlp=wanted, embed=False)
    run = model.run(given.tokens, capture=capture, logits_at=[pos])
    target_id = int(run.logits[0, 0].argmax()) if target is None else single_token_id(model, target, "target")
    direction = model.readout.logit_direction([target_id], run.stream.final_norm_scale[:, 0]).vector[0]
    frames = []
    with torch.no_grad():
        for layer in layer_list:
            record = run.stream.layers[layer].mlp
            weights = record.expert_weights[0, 0] if experts else None
            scale = record.post_norm_scale[0, 0] if model.config.post_norms else None
            updates = sub_update_vectors(model, layer, record.post[0, 0], weights, scale)
            frames += _rank_layer(model, layer, record.post[0, 0].float(), updates, direction, k, value_k)
    df = pd.concat(frames, ignore_index=True)
    expert_column = df["expert"].to_numpy() if "expert" in df else None
    df.insert(0, "site", site_column(df["layer"].to_numpy(), df["neuron"].to_numpy(), expert_column))
    df["pos"] = np.int64(pos)
    df["target_id"] = np.int64(target_id)
    df["target"] = str(decode_ids(model, np.array([target_id]))[0])
    parameters = {"position": pos, "layers": layer_list, "k": k, "value_k": value_k}
    df.attrs["provenance"] = describe(model, "neurons.sub_updates", parameters, given.record(), target_id)
    return df


def sub_update_vectors(
    model: Transformer,
    layer: int,
    post: Float[Tensor, "d_mlp"] | Float[Tensor, "expert d_mlp"],
    expert_weights: Float[Tensor, "expert"] | None = None,
    post_norm_scale: Float[Tensor, "1"] | None = None,
) -> Float[Tensor, "d_mlp d_model"] | Float[Tensor, "expert d_mlp d_model"]:
    """m_i * v_i for every neuron of `layer` (float32), given the coefficients `post` at one token: they
    sum, with b_out, to the MLP's output there (before a post-norm).

    Mixture of experts: post is [expert d_mlp] and `expert_weights` [expert] (record.expert_weights at the
    token) is required; the result is [expert d_mlp d_model], w_e * m_{e,i} * v_{e,i}, summing to the output.
    post_norm_scale (record.post_norm_scale at the token; models with post-norms only): the sub-updates as
    written into the residual, s * linear_post(m_i v_i), with the post-norm's scale s frozen there."""
    layer = select_layers(model, layer)[0]
    block = model.blocks[layer]
    experts = model.config.n_experts if model.config.has_experts(layer) else 0
    if experts and (expert_weights is None or post.ndim != 2):
        raise ResidError(
            f"Layer {layer}'s MLP is a mixture of {experts} experts: pass post [expert d_mlp] and its "
            "expert_weights [expert] at the token (record.post[b, p], record.expert_weights[b, p])."
        )
    if not experts and (expert_weights is not None or post.ndim != 1):
        raise ResidError(f"Layer {layer}'s MLP is dense: pass post [d_mlp] (record.post[b, p]) and no expert_weights.")
    if post_norm_scale is not None and block.ln_mlp_post is None:
        raise ResidError(f"post_norm_scale was given, but {model.name} has no post-norms: leave it None.")
    with torch.no_grad():
        coefficients = post.float() if not experts else post.float() * expert_weights.float()[:, None]
        updates = coefficients[..., None] * block.mlp.W_out.float()
        if post_norm_scale is not None:
            updates = block.ln_mlp_post.linear(updates) * post_norm_scale.float()
        return updates


def _rank_layer(
    model: Transformer,
    layer: int,
    post: Float[Tensor, "d_mlp"] | Float[Tensor, "expert d_mlp"],
    updates: Float[Tensor, "d_mlp d_model"] | Float[Tensor, "expert d_mlp d_model"],
    direction: Float[Tensor, "d_model"],
    k: int,
    value_k: int,
) -> list[pd.DataFrame]:
    d_mlp = post.shape[-1]
    values = model.blocks[layer].mlp.W_out
    post_norm = model.blocks[layer].ln_mlp_post
    values = values.float() if post_norm is None else post_norm.linear(values)  # as written (its gain)
    value_norm = values.norm(dim=-1).reshape(-1)
    updates, post = updates.reshape(-1, updates.shape[-1]), post.reshape(-1)  # (expert, neuron) flattened
    magnitude = updates.norm(dim=-1)  # |m_i| * ||v_i||
    contribution = updates @ direction
    total = updates.sum(0)
    total_target = total @ direction
    frames = []
    for ranking, scores in zip(RANKINGS, (magnitude, contribution)):
        chosen = scores.topk(k).indices
        covered = updates[chosen].sum(0)
        promoted = model.readout.vector_logits(updates[chosen]).topk(value_k, dim=-1).indices.cpu().numpy()
        where = {"layer": np.full(k, layer, dtype=np.int64)}
        if model.config.has_experts(layer):
            where["expert"] = (chosen // d_mlp).cpu().numpy().astype(np.int64)
        frames.append(pd.DataFrame({
            **where,
            "ranking": ranking,
            "rank": np.arange(1, k + 1, dtype=np.int64),
            "neuron": (chosen % d_mlp).cpu().numpy().astype(np.int64),
            "coefficient": post[chosen].double().cpu().numpy(),
            "value_norm": value_norm[chosen].double().cpu().numpy(),
            "magnitude": magnitude[chosen].double().cpu().numpy(),
            "target_contribution": contribution[chosen].double().cpu().numpy(),
            "promotes": [" ".join(repr(t) for t in row) for row in decode_ids(model, promoted)],
            "explained_norm": _ratio(covered @ total, total @ total),
            "explained_target": _ratio(covered @ direction, total_target),
            "layer_norm": float(total.norm()),
            "layer_target": float(total_target),
        }))
    return frames


def _ratio(part: Tensor, whole: Tensor) -> float:
    whole = float(whole)
    return float(part) / whole if whole != 0.0 else float("nan")
