"""A splice of a dictionary's reconstruction alone at chosen positions only, for evaluation: the positions a
dictionary was trained on are replaced by its reconstruction (or by zeros), the others (BOS, padding) keep the
model's own tensor. resid.dictionaries.Splice(d, error=False) replaces every position of the pass; a dictionary
trained without BOS reconstructs a BOS residual (an attention-sink outlier, ~100 times the usual norm in SmolLM2,
whose first token is its sink) so badly that every later token's prediction breaks, which would measure BOS, not
the dictionary.

    splice_at       one dictionary's output tensor
    splice_clt_at   every MLP write of a cross-layer transcoder, each layer at its own positions

The hooks read and write each tensor as resid.dictionaries.attach does for a splice (the same views of a
standardized norm input or of flattened heads), so the two agree wherever both splice.
"""

import torch
from jaxtyping import Bool
from torch import Tensor

from resid.dictionaries import CrossLayerTranscoder, Dictionary
from resid.interventions import Hook


def splice_at(model, d: Dictionary, where: Bool[Tensor, "batch pos"], zero: bool = False) -> list[Hook]:
    """Interventions replacing d's output tensor by its reconstruction (zero=True: by zeros) where `where` is
    True. A transcoder's input is read, unchanged, earlier in the pass."""
    found: dict[str, Tensor] = {}

    def tap(value: Tensor, tokens) -> Tensor:
        found["x"] = d.point_in.view(value, model)
        return value

    def splice(value: Tensor, tokens) -> Tensor:
        target = d.point_out.view(value, model)
        x = found.pop("x") if d.is_transcoder else target
        new = torch.zeros_like(target) if zero else d.decode(d.encode(x), x).to(target.dtype)
        mask = where.to(target.device).view(*where.shape, *([1] * (target.ndim - 2)))
        return d.point_out.unview(torch.where(mask, new, target), value, model)

    hooks = [Hook(d.point_in.site, tap)] if d.is_transcoder else []
    return hooks + [Hook(d.point_out.site, splice)]


def splice_clt_at(model, clt: CrossLayerTranscoder, where: list[Bool[Tensor, "batch pos"]], zero: bool = False
                  ) -> list[Hook]:
    """Interventions replacing every layer's MLP write by the cross-layer transcoder's reconstruction (zero=True: by
    zeros) where `where[layer]` is True. Layer l's features read layer l's MLP input of this pass, so each layer's
    reconstruction is built from the features of the spliced run, as Splice(clt, error=False) builds it."""
    acts: list[Tensor] = []
    inputs: list[Tensor] = []

    def tap(layer: int):
        def hook(value: Tensor, tokens) -> Tensor:
            x = clt.points_in[layer].view(value, model)
            inputs.append(x)
            acts.append(clt.encode_layer(layer, x))
            return value

        return hook

    def splice(layer: int):
        def hook(value: Tensor, tokens) -> Tensor:
            point = clt.points_out[layer]
            target = point.view(value, model)
            new = torch.zeros_like(target) if zero else clt.decode_layer(layer, torch.stack(acts), inputs[layer])
            mask = where[layer].to(target.device).view(*where[layer].shape, *([1] * (target.ndim - 2)))
            return point.unview(torch.where(mask, new.to(target.dtype), target), value, model)

        return hook

    hooks = [] if zero else [Hook(p.site, tap(layer)) for layer, p in enumerate(clt.points_in)]
    return hooks + [Hook(p.site, splice(layer)) for layer, p in enumerate(clt.points_out)]
