"""Sub-updates (Geva et al. 2022): an MLP's output at one token split into its neurons' m_i * v_i, ranked by
size and by direct contribution to a target logit. See analyses.neurons for the glossary."""

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from analyses.checks import check_k, select_layers
from analyses.inputs import prompts as as_prompts
from analyses.io.provenance import describe
from analyses.vocab import decode_ids, single_token_id
from resid.capture import Capture
from resid.errors import ResidError
from resid.model import Inputs, Transformer

RANKINGS = ("magnitude", "target")


def sub_updates(
    model: Transformer,
    prompt: Inputs,
    pos: int = -1,
    layers: int | Sequence[int] | None = None,
    k: int = 10,
    target: str | int | None = None,
    value_k: int = 5,
) -> pd.DataFrame:
    """The top-k sub-updates m_i * v_i of each layer's MLP at token `pos` of one prompt (a text, or a
    one-row Tokens or id tensor; see the module docstring). target: a single token or id; default the model's top prediction at `pos`.

    One row per (layer, ranking, rank), ranking "magnitude" (by |m_i| ||v_i||) or "target" (by the
    contribution to the target's logit, largest first): layer ranking rank neuron coefficient value_norm
    magnitude target_contribution promotes (the `value_k` tokens whose logits m_i v_i raises most, through
    the final norm) explained_norm explained_target layer_norm (||U||) layer_target (U . u') pos target_id
    target."""
    layer_list = select_layers(model, layers)
    k = check_k(k, "k", model.config.d_mlp)
    value_k = check_k(value_k, "value_k", model.config.d_vocab)
    given = as_prompts(model, prompt)
    if len(given) != 1:
        raise ResidError(f"sub_updates takes one prompt, got {len(given)}: call it once per prompt.")
    pos = int(given.tokens.padded_index([pos])[0, 0] - given.tokens.first_positions()[0])
    capture = Capture(layers=layer_list, positions=[pos], attn=frozenset(), mlp={"post"}, embed=False)
    run = model.run(given.tokens, capture=capture, logits_at=[pos])
    target_id = int(run.logits[0, 0].argmax()) if target is None else single_token_id(model, target, "target")
    direction = model.readout.logit_direction([target_id], run.stream.final_norm_scale[:, 0]).vector[0]
    frames = []
    with torch.no_grad():
        for layer in layer_list:
            post = run.stream.layers[layer].mlp.post[0, 0].float()
            frames += _rank_layer(model, layer, post, direction, k, value_k)
    df = pd.concat(frames, ignore_index=True)
    df["pos"] = np.int64(pos)
    df["target_id"] = np.int64(target_id)
    df["target"] = str(decode_ids(model, np.array([target_id]))[0])
    parameters = {"pos": pos, "layers": layer_list, "k": k, "value_k": value_k}
    df.attrs["provenance"] = describe(model, "neurons.sub_updates", parameters, given.record(), target_id)
    return df


def sub_update_vectors(
    model: Transformer, layer: int, post: Float[Tensor, "d_mlp"]
) -> Float[Tensor, "d_mlp d_model"]:
    """m_i * v_i for every neuron of `layer` (float32), given the coefficients `post` at one token: they
    sum, with b_out, to the MLP's output there."""
    layer = select_layers(model, layer)[0]
    with torch.no_grad():
        return post.float()[:, None] * model.blocks[layer].mlp.W_out.float()


def _rank_layer(
    model: Transformer,
    layer: int,
    post: Float[Tensor, "d_mlp"],
    direction: Float[Tensor, "d_model"],
    k: int,
    value_k: int,
) -> list[pd.DataFrame]:
    updates = sub_update_vectors(model, layer, post)
    value_norm = model.blocks[layer].mlp.W_out.float().norm(dim=-1)
    magnitude = updates.norm(dim=-1)  # |m_i| * ||v_i||
    contribution = updates @ direction
    total = updates.sum(0)
    total_target = total @ direction
    frames = []
    for ranking, scores in zip(RANKINGS, (magnitude, contribution)):
        chosen = scores.topk(k).indices
        covered = updates[chosen].sum(0)
        promoted = model.readout.vector_logits(updates[chosen]).topk(value_k, dim=-1).indices.cpu().numpy()
        frames.append(pd.DataFrame({
            "layer": np.full(k, layer, dtype=np.int64),
            "ranking": ranking,
            "rank": np.arange(1, k + 1, dtype=np.int64),
            "neuron": chosen.cpu().numpy().astype(np.int64),
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
