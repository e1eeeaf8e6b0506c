"""Typed interventions on the residual-stream writes, applied inside `model.run` and nowhere else.

A `Site` names what is edited: a sublayer's write (`part="attn"|"mlp"`), one head's `z` (the head's
attention-weighted value mix, before W_O, so its write is `z[h] @ W_O[h]`), or one neuron's coefficient
`post[i]` (Geva et al.'s memory coefficient, so its write is `post[i] * W_out[i]`); in a mixture of experts
(Mixtral), one expert's weighted write or one expert neuron's coefficient; optionally only at some
prompt-relative positions (0 = each prompt's first real token, -1 its last, whatever the padding).

The edited slice a tensor value must broadcast to is [batch pos d_model] for a whole write, [batch pos d_head]
for a head, [batch pos d_model] for an expert's write and [batch pos] for a neuron, where pos is the sequence,
or the chosen positions in the order given.

`Hook(site, fn)` says what the four typed edits cannot: fn gets that same slice and the run's Tokens, and
returns a tensor of the same shape and dtype (checked).

Nothing is attached to the model: `run` hands each sublayer the edits for it, so an intervention cannot
outlive the call that asked for it.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.tokenizer import Tokens


Kind = Literal["write", "head", "neuron", "expert", "q", "k", "v", "pattern"]  # what a Site edits (Site.kind)


@dataclass(frozen=True)
class Site:
    """Where an intervention edits: `layer` and `part`, then optionally one head or one neuron, and optionally
    some positions. The edited slice (what a Replace value must match or broadcast to):

        Site(3, "attn")                 the attention write      [batch pos d_model]
        Site(3, "mlp")                  the MLP write            [batch pos d_model]
        Site(3, "attn", head=5)         head 5's z               [batch pos d_head]  (the head writes z @ W_O[5])
        Site(3, "attn", head=5, input="q")  head 5's query       [batch pos d_head]  (after rotary; "k" / "v":
                                        key / value head 5, shared by its query heads under grouped-query attention)
        Site(3, "attn", head=5, input="pattern")  its attention pattern [batch pos key_pos] (z = pattern @ v)
        Site(3, "cross", head=5)        a decoder's cross-attention head 5 (encoder-decoder models); "cross"
                                        alone is that sublayer's write
        Site(3, "mlp", neuron=42)       neuron 42's post         [batch pos]         (it writes post * W_out[42])
        Site(3, "mlp", expert=2)        expert 2's weighted write [batch pos d_model] (mixture-of-experts MLPs)
        Site(3, "mlp", expert=2, neuron=42)  expert 2's post[42] [batch pos]  (it writes weight * post * W_out[2, 42])

    An expert's write is zero at tokens not routed to it. ZeroAblate of an expert removes its contribution and
    does not renormalize the other chosen experts' weights (the router is left as it was); editing an expert
    neuron changes nothing at tokens not routed to that expert (their weight is 0).

    With positions=[...] the pos axis holds those prompt-relative positions (0 = each prompt's first real
    token, -1 its last, whatever the padding), in the order given: e.g. [batch 1 d_model] for positions=[-1].
    """

    layer: int  # negative counts from the last layer
    part: str  # "attn", "mlp" or "cross" (checked here, so a typo is a ResidError, not a type-checker traceback)
    head: int | None = None  # attn / cross only: edit this head's z instead of the whole write
    neuron: int | None = None  # mlp only: edit this neuron's coefficient post[i]
    positions: Sequence[int] | None = None  # prompt-relative (-1: each prompt's last token); None = every position
    expert: int | None = None  # mlp of a mixture of experts only: this expert's write (or, with neuron, its post[i])
    # attn / cross with head only: the head's query ("q") or pattern ("pattern"), or the key / value ("k", "v") of
    # the key/value head `head` (grouped-query models share it among query heads), as the scores read them
    input: str | None = None

    def __post_init__(self) -> None:
        if self.part not in ("attn", "mlp", "cross"):
            raise ResidError(
                f"Site part must be 'attn', 'mlp' or 'cross' (decoders' cross-attention), got {self.part!r}."
            )
        if self.expert is not None and self.part != "mlp":
            raise ResidError(f"Site(layer={self.layer}, part='attn') cannot take an expert; experts are part='mlp'.")
        if self.head is not None and self.part == "mlp":
            raise ResidError(
                f"Site(layer={self.layer}, part='mlp') cannot take a head; heads are part='attn' (or 'cross')."
            )
        if self.neuron is not None and self.part != "mlp":
            raise ResidError(
                f"Site(layer={self.layer}, part={self.part!r}) cannot take a neuron; neurons are part='mlp'."
            )
        if self.input is not None and (self.input not in ("q", "k", "v", "pattern") or self.head is None):
            raise ResidError(f"Site input must be 'q', 'k', 'v' or 'pattern' with a head (Site(l, 'attn', head=h, "
                             f"input='q')), got input={self.input!r}, head={self.head!r}.")
        if self.positions is not None:
            object.__setattr__(self, "positions", tuple(int(p) for p in self.positions))

    @property
    def kind(self) -> Kind:
        """What the site edits: the sublayer's whole write, one head's z, one neuron's coefficient (of the
        expert `expert` in a mixture of experts), one expert's whole weighted write, or a head's input."""
        if self.input is not None:
            return self.input
        if self.head is not None:
            return "head"
        if self.neuron is not None:
            return "neuron"
        return "expert" if self.expert is not None else "write"

    def describe(self) -> str:
        where = f"layers[{self.layer}].{self.part}"
        if self.head is not None:
            where += f" head {self.head}" + (f" {self.input}" if self.input is not None else "")
        if self.expert is not None:
            where += f" expert {self.expert}"
        if self.neuron is not None:
            where += f" neuron {self.neuron}"
        if self.positions is not None:
            where += f" positions {list(self.positions)}"
        return where

    def validate(self, config: ModelConfig) -> None:
        n = config.n_layers
        if not -n <= self.layer < n:
            raise ResidError(
                f"Site layer {self.layer} is out of range: the model has {n} layers (0..{n - 1}, or -{n}..-1)."
            )
        if self.part == "cross" and not config.cross_attention:
            raise ResidError(
                f"Site(layer={self.layer}, part='cross'): this model has no cross-attention (only decoders of "
                "encoder-decoder models do); use part='attn' or 'mlp'."
            )
        if self.input in ("k", "v") and not 0 <= self.head < config.n_kv_heads:
            raise ResidError(f"Site head {self.head} is out of range for input={self.input!r}: keys and values have "
                             f"{config.n_kv_heads} heads.")
        if self.head is not None and not 0 <= self.head < config.n_heads:
            raise ResidError(f"Site head {self.head} is out of range: the model has {config.n_heads} heads.")
        if self.neuron is not None and not 0 <= self.neuron < config.d_mlp:
            raise ResidError(f"Site neuron {self.neuron} is out of range: the MLP has {config.d_mlp} neurons.")
        experts = config.n_experts
        if self.expert is not None and not experts:
            raise ResidError(
                f"Site expert {self.expert}: this model's MLPs are dense, not mixtures of experts. Drop expert= "
                f"(Site({self.layer}, 'mlp') or Site({self.layer}, 'mlp', neuron=i))."
            )
        if self.expert is not None and not 0 <= self.expert < experts:
            raise ResidError(
                f"Site expert {self.expert} is out of range: each MLP has {experts} experts (0..{experts - 1})."
            )
        if experts and self.neuron is not None and self.expert is None:
            raise ResidError(
                f"Site neuron {self.neuron}: layer {self.layer}'s MLP is a mixture of {experts} experts, each with "
                f"its own neurons. Name the expert: Site({self.layer}, 'mlp', expert=e, neuron={self.neuron})."
            )


@dataclass(frozen=True)
class ZeroAblate:
    """Set the site's slice to zero: a head's z or a neuron's coefficient (so its write is zero), the
    sublayer's whole write (its bias included), or one expert's weighted write (the other experts keep their
    weights: nothing is renormalized)."""

    site: Site

    def edit(self, target: Tensor) -> Tensor:
        return torch.zeros_like(target)


@dataclass(frozen=True)
class Replace:
    """Replace the site's slice with `value` (e.g. a clean run's activation, for patching). `value` must have
    the slice's shape or broadcast to it: [batch pos d_model] or [d_model] for a whole write, [batch pos d_head]
    or [d_head] for a head's z, [batch pos] for a neuron's coefficient; with Site(positions=[...]) pos is the
    number of positions given (a clean run captured with the same Capture(positions=...) has that shape)."""

    site: Site
    value: Tensor

    def edit(self, target: Tensor) -> Tensor:
        _check_broadcast(self, self.value, target)
        return self.value.to(target.device, target.dtype).expand_as(target)


@dataclass(frozen=True)
class Scale:
    """Multiply the site's slice by `factor`: a number, or a tensor that broadcasts to the slice (e.g. [batch 1
    1] for one factor per prompt on a write)."""

    site: Site
    factor: float | Tensor  # a number, or a tensor broadcastable to the edited slice

    def edit(self, target: Tensor) -> Tensor:
        if isinstance(self.factor, Tensor):
            _check_broadcast(self, self.factor, target)
            return target * self.factor.to(target.device, target.dtype)
        return target * self.factor


@dataclass(frozen=True)
class Add:
    """Add `vector` to the site's slice, e.g. a steering vector [d_model] on a write (at every position, or at
    the Site's positions); [d_head] on a head's z; anything else that broadcasts to the slice."""

    site: Site
    vector: Tensor

    def edit(self, target: Tensor) -> Tensor:
        _check_broadcast(self, self.vector, target)
        return target + self.vector.to(target.device, target.dtype)


@dataclass(frozen=True)
class Hook:
    """Any function of the site's slice: `fn(slice, tokens)` gets the slice the typed interventions edit
    ([batch pos d_model] for a write or an expert's write, [batch pos d_head] for a head, [batch pos] for a
    neuron; pos the Site's positions if given, in order) and the run's Tokens (padded: `tokens.padded_index`
    maps prompt-relative positions), and returns the new slice. It must not change the shape or dtype;
    editing in place is fine."""

    site: Site
    fn: Callable[[Tensor, Tokens], Tensor]

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ResidError(f"Hook at {self.site.describe()} needs a function fn(slice, tokens), got {self.fn!r}.")

    def edit(self, target: Tensor, tokens: Tokens) -> Tensor:
        result = self.fn(target, tokens)
        if not (isinstance(result, Tensor) and result.shape == target.shape and result.dtype == target.dtype):
            got = f"{tuple(result.shape)} {result.dtype}" if isinstance(result, Tensor) else type(result).__name__
            raise ResidError(
                f"Hook at {self.site.describe()}: fn must not change the shape or dtype of the slice it edits. It "
                f"got {tuple(target.shape)} {target.dtype} and returned {got}; return a tensor of shape "
                f"{tuple(target.shape)} and dtype {target.dtype} (batch, pos, ...)."
            )
        return result.to(target.device)


@dataclass(frozen=True)
class HookCall:
    """A Hook bound to the Tokens of the run it edits. `plan` binds it, where the Tokens are known, so that
    the sublayers pass their edits on unchanged and `apply_edits` calls every edit the same way."""

    hook: Hook
    tokens: Tokens

    @property
    def site(self) -> Site:
        return self.hook.site

    def edit(self, target: Tensor) -> Tensor:
        return self.hook.edit(target, self.tokens)


Intervention = ZeroAblate | Replace | Scale | Add | Hook


def _check_broadcast(iv: Intervention, value: Tensor, target: Tensor) -> None:
    try:
        ok = torch.broadcast_shapes(value.shape, target.shape) == target.shape
    except RuntimeError:
        ok = False
    if not ok:
        raise ResidError(
            f"{type(iv).__name__} at {iv.site.describe()} got a tensor of shape {tuple(value.shape)}, which does "
            f"not broadcast to the edited slice of shape {tuple(target.shape)} (batch, pos, ...). Pass a tensor of "
            "that shape, or one that broadcasts to it."
        )


# An intervention (a Hook bound to its run's Tokens) and the [batch k] padded indices it edits (None: all)
Edit = tuple[ZeroAblate | Replace | Scale | Add | HookCall, Tensor | None]


def plan(
    interventions: Sequence[Intervention], config: ModelConfig, tokens: Tokens
) -> dict[tuple[int, str], list[Edit]]:
    """Validate every intervention, resolve its prompt-relative positions against this batch, and group them by
    (layer, part), layers made non-negative."""
    grouped: dict[tuple[int, str], list[Edit]] = {}
    for iv in interventions:
        if not isinstance(iv, (ZeroAblate, Replace, Scale, Add, Hook)):
            raise ResidError(
                f"Unknown intervention {iv!r}: use resid.ZeroAblate, resid.Replace, resid.Scale, resid.Add or "
                "resid.Hook."
            )
        iv.site.validate(config)
        index = None if iv.site.positions is None else tokens.padded_index(iv.site.positions)
        edit = HookCall(iv, tokens) if isinstance(iv, Hook) else iv
        grouped.setdefault((iv.site.layer % config.n_layers, iv.site.part), []).append((edit, index))
    return grouped


def apply_edits(tensor: Tensor, edits: Sequence[Edit], kind: Kind) -> Tensor:
    """Apply the edits of this kind (whole write / head / neuron / expert write / head input) to `tensor`
    [batch pos ...] (a pattern as [batch pos head key_pos]). Experts: the caller passes only the edits of the
    expert whose tensor this is."""
    for iv, index in edits:
        if iv.site.kind != kind:
            continue
        unit = iv.site.neuron if kind == "neuron" else None if kind in ("write", "expert") else iv.site.head
        rows = torch.arange(tensor.shape[0], device=tensor.device)[:, None]
        region = (slice(None), slice(None)) if index is None else (rows, index)
        region = region if unit is None else (*region, unit)
        tensor = tensor.clone()
        tensor[region] = iv.edit(tensor[region])
    return tensor
