"""Typed interventions on sites of a run (resid.sites), applied inside `model.run` and nowhere else.

A `Site` names what is edited: the residual stream itself (`Site(l, "resid_pre" | "resid_mid" | "resid_post")`), an
embedding write (`Site(None, "embed")`), a sublayer's write (`Site(l, "attn" | "cross" | "mlp")`), one head's `z`
(the head's attention-weighted value mix, before W_O, so its write is `z[h] @ W_O[h]`), a head's q, k, v, scores (the
softmax's input) or pattern, its q_proj / k_proj (before q/k norm and rotary), one neuron's coefficient `post[i]`
(Geva et al.'s memory coefficient, so its write is `post[i] * W_out[i]`); in a mixture of experts (Mixtral), one
expert's weighted write or one expert neuron's coefficient; `Site(l, "layer")` (ZeroAblate and Scale only) stands for
every sublayer write of the layer. Optionally only at some prompt-relative positions (0 = each prompt's first real
token, -1 its last, whatever the padding).

The edited slice a tensor value must broadcast to is [batch pos d_model] for the residual, an embedding or a whole
write, [batch pos d_head] for a head's z / q (a key/value head's k / v), [batch pos key_pos] for a head's pattern or
scores, [batch pos d_model] for an expert's write and [batch pos] for a neuron; a field edited whole keeps its head
axis ([batch pos head d_head], a pattern [batch pos head key_pos]). pos is the sequence, or the chosen positions in
the order given.

Editing a residual site adds (new - old) to the stream there; the run's stream records that difference
(resid.stream), so the stream's writes still sum to what the model computed.

`Hook(site, fn)` says what the four typed edits cannot: fn gets that same slice and the run's Tokens, and
returns a tensor of the same shape and dtype (checked).

Nothing is attached to the model: `run` hands each sublayer the edits for it, so an intervention cannot
outlive the call that asked for it.
"""

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.sites import Site
from resid.tokenizer import Tokens

__all__ = ["Add", "Edit", "Hook", "HookCall", "Intervention", "Replace", "Scale", "Site", "ZeroAblate", "apply_edits",
           "edit_residual", "group_edits"]

# What each part lets interventions edit (Site.what); everything else of a site is read-only
EDITABLE = {"attn": ("out", "z", "q_proj", "k_proj", "q", "k", "v", "scores", "pattern", "normalized", "kv_latent"),
            "cross": ("out", "z", "q_proj", "k_proj", "q", "k", "v", "scores", "pattern", "normalized"),
            "mlp": ("out", "post", "expert_out", "normalized"), "embed": ("write",), "pos_embed": ("write",),
            "type_embed": ("write",), "resid_pre": ("resid",), "resid_mid": ("resid",), "resid_cross": ("resid",),
            "resid_post": ("resid",)}


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
            raise ResidError(f"Hook at {self.site.label} needs a function fn(slice, tokens), got {self.fn!r}.")

    def edit(self, target: Tensor, tokens: Tokens) -> Tensor:
        result = self.fn(target, tokens)
        if not (isinstance(result, Tensor) and result.shape == target.shape and result.dtype == target.dtype):
            got = f"{tuple(result.shape)} {result.dtype}" if isinstance(result, Tensor) else type(result).__name__
            raise ResidError(
                f"Hook at {self.site.label}: fn must not change the shape or dtype of the slice it edits. It "
                f"got {tuple(target.shape)} {target.dtype} and returned {got}; return a tensor of shape "
                f"{tuple(target.shape)} and dtype {target.dtype} (batch, pos, ...)."
            )
        return result.to(target.device)


@dataclass(frozen=True)
class HookCall:
    """A Hook bound to the Tokens of the run it edits. `group_edits` binds it, where the Tokens are known, so that
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
            f"{type(iv).__name__} at {iv.site.label} got a tensor of shape {tuple(value.shape)}, which does "
            f"not broadcast to the edited slice of shape {tuple(target.shape)} (batch, pos, ...). Pass a tensor of "
            "that shape, or one that broadcasts to it."
        )


# An intervention (a Hook bound to its run's Tokens) and the [batch k] padded indices it edits (None: all)
Edit = tuple[ZeroAblate | Replace | Scale | Add | HookCall, Tensor | None]


def group_edits(
    interventions: Sequence[Intervention], config: ModelConfig, tokens: Tokens
) -> dict[Site, list[Edit]]:
    """Validate every intervention, resolve its site against the model (indices non-negative) and its
    prompt-relative positions against this batch, and group them by the whole site of their part
    (Site(l, "attn"), Site(l, "resid_pre"), Site(None, "embed"), ...: the places the forward pass edits). A
    Site(l, "layer") of a ZeroAblate or Scale stands for each sublayer write of layer l."""
    grouped: dict[Site, list[Edit]] = {}
    for iv in interventions:
        if not isinstance(iv, (ZeroAblate, Replace, Scale, Add, Hook)):
            raise ResidError(
                f"Unknown intervention {iv!r}: use resid.ZeroAblate, resid.Replace, resid.Scale, resid.Add or "
                "resid.Hook."
            )
        if not isinstance(iv.site, Site):
            raise ResidError(f"{type(iv).__name__} needs a resid.Site, got {iv.site!r}.")
        site = iv.site.resolve(config)
        index = None if site.positions is None else tokens.padded_index(site.positions)
        for part_site in _edited_sites(iv, site, config):
            edit = dataclasses.replace(iv, site=part_site)
            edit = HookCall(edit, tokens) if isinstance(edit, Hook) else edit
            grouped.setdefault(Site(part_site.layer, part_site.part), []).append((edit, index))
    return grouped


def _edited_sites(iv: Intervention, site: Site, config: ModelConfig) -> list[Site]:
    if site.part == "layer":
        if not isinstance(iv, (ZeroAblate, Scale)):
            raise ResidError(f"{type(iv).__name__} at {site.label}: a whole layer is several writes, "
                             "so only ZeroAblate "
                             "and Scale take it; edit Site(l, 'attn') and Site(l, 'mlp') (or the residual) instead.")
        parts = ("attn", "cross", "mlp") if config.cross_attention else ("attn", "mlp")
        return [dataclasses.replace(site, part=part) for part in parts]
    if site.of_dictionary:
        raise ResidError(f"{type(iv).__name__} at {site.label}: a dictionary's feature is edited through the "
                         "dictionary; pass it, model.run(..., dictionaries=[dictionary]) (resid.dictionaries.edits).")
    if site.what not in EDITABLE.get(site.part, ()):
        raise ResidError(f"{type(iv).__name__} at {site.label}: {site.what!r} of {site.part!r} can be read and "
                         f"captured but not edited. Editable: {_editable_text()}.")
    if site.what == "post" and site.expert is None and config.has_experts(site.layer):
        raise ResidError(f"{type(iv).__name__} at {site.label}: in a mixture of experts, edit one expert's neuron "
                         f"(Site({site.layer}, 'mlp', expert=e, neuron=i)) or one expert's write.")
    return [site]


def _editable_text() -> str:
    return "; ".join(f"{part}: {', '.join(whats)}" for part, whats in EDITABLE.items())


def apply_edits(tensor: Tensor, edits: Sequence[Edit], what: str) -> Tensor:
    """Apply the edits of this field (Site.what: "out", "z", "post", "resid", ...) to `tensor` [batch pos ...]
    (a pattern as [batch pos head key_pos]). Experts: the caller passes only the edits of the expert whose tensor
    this is."""
    for iv, index in edits:
        if iv.site.what != what:
            continue
        unit = None if what == "expert_out" else iv.site.unit
        rows = torch.arange(tensor.shape[0], device=tensor.device)[:, None]
        region = (slice(None), slice(None)) if index is None else (rows, index)
        region = region if unit is None else (*region, unit)
        new = iv.edit(tensor[region])  # read before the copy is written: autograd may keep what the edit read
        tensor = tensor.clone()
        tensor[region] = new
    return tensor


def edit_residual(resid: Tensor, edits: Sequence[Edit], part: str, deltas: dict[str, Tensor]) -> Tensor:
    """The residual after the edits of a residual site (`part`: "resid_pre", ...); what they added is kept in
    `deltas[part]`, which the run's stream adds back, so its sums stay the residual the model computed."""
    if not edits:
        return resid
    edited = apply_edits(resid, edits, "resid")
    deltas[part] = edited - resid
    return edited
