"""First-order patching effects of every site from one gradient at the base run (resid.analyses.patching.atp):

    effect(site) ~ (donor value - base value) . d metric / d value      summed over the site's positions

and the two refinements of AtP* (Kramár et al. 2024):

- Queries and keys (the attention-saturation fix). A head's q or k acts through a softmax, whose gradient is flat
  where the pattern is saturated, so plain AtP misses large effects there. Here the new pattern is computed
  exactly (the donor's queries with the base keys, or the base queries with the donor's keys) and only the step
  from the pattern on is linear: effect ~ sum over (query, key) of (new pattern - pattern) * d metric / d pattern.
- GradDrop. An effect can cancel between paths (a head's direct write against what later layers make of it).
  For each layer l the gradient is taken again with nothing flowing back through layer l's writes (the sites of
  layer l itself then get none); the estimate of the effect's size is sum_l |estimate without layer l| / (L - 1),
  which is |estimate| for a site whose effect takes a single path.

d metric / d pattern needs no explicit pattern in the graph: z = pattern @ v, so it is (d metric / d z) v^T.
"""

from collections.abc import Sequence

import torch
from torch import Tensor

from resid.analyses.patching.pairs import Mapping
from resid.interventions import Hook
from resid.model import Transformer
from resid.sites import Site
from resid.stream import ResidualStream
from resid.tokenizer import Tokens

EMBED = Site(None, "embed")


def captured(sites: Sequence[str]) -> set[str]:
    """The attention values both runs must capture for these sites (besides the writes)."""
    attn = {"z"} if {"head", "q", "k", "pattern"} & set(sites) else set()
    attn |= {"v"} if {"v", "q", "k", "pattern"} & set(sites) else set()  # v: d metric / d pattern
    return attn | ({"q", "k"} if {"q", "k", "pattern"} & set(sites) else set())


def nodes(stream: ResidualStream, sites: Sequence[str]) -> dict[Site, Tensor]:
    """The base run's tensors to differentiate the metric by: the embedding, every write, and what the head sites
    need (each layer's z, q, k, v, whole)."""
    wrt = {EMBED: stream.embed}
    attn = captured(sites)
    for l, record in enumerate(stream.layers):
        wrt[Site(l, "attn")], wrt[Site(l, "mlp")] = record.attn.out, record.mlp.out
        for name in ("z", "q", "k", "v"):
            if name in attn:
                wrt[Site(l, "attn", field=name)] = getattr(record.attn, name)
    return wrt


class _Gate(torch.autograd.Function):
    """The identity, whose backward scales the gradient by open[layer] (read when the backward runs)."""

    @staticmethod
    def forward(ctx, x: Tensor, open_: Tensor, layer: int) -> Tensor:
        ctx.open, ctx.layer = open_, layer
        return x.clone()

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad * ctx.open[ctx.layer], None, None


def gates(model: Transformer) -> tuple[Tensor, list[Hook]]:
    """(open, hooks): hooks on every layer's writes that pass the gradient through times open[layer]; set
    open[l] = 0 and take the gradient again to drop layer l (GradDrop), with no second forward pass."""
    open_ = torch.ones(model.config.n_layers, dtype=model.dtype, device=model.device)
    hooks = [Hook(Site(l, part), lambda x, tokens, l=l: _Gate.apply(x, open_, l))
             for l in range(model.config.n_layers) for part in ("attn", "mlp")]
    return open_, hooks


class Effects:
    """Each site's first-order effect [batch] from a gradient of the metric at the base run."""

    def __init__(self, model: Transformer, base: ResidualStream, donor: ResidualStream, tokens: Tokens,
                 sites: Sequence[str], fix_qk: bool, at: Mapping):
        self.model, self.sites, self.fix_qk = model, set(sites), fix_qk
        self.base, self.donor, self.at = base, donor, at
        self.mask = tokens.attention_mask.to(model.device)[..., None].to(model.dtype)  # [batch pos 1]
        # a layer's whole pattern / q / k site -> the patched pattern minus the base run's; deltas: each site's
        # patched minus base value; both computed once, reused by every backward pass of GradDrop
        self.moved: dict[Site, Tensor] = {}
        self.deltas: dict[Site, Tensor] = {}
        needed = "pattern" in self.sites or (fix_qk and bool({"q", "k"} & self.sites))
        with torch.no_grad():
            ctx = model.attention_context(tokens) if needed else None  # checked and masked once, not per layer
            for l, (ours, theirs) in enumerate(zip(base.layers, donor.layers) if needed else ()):
                q, k = ours.attn.q.detach(), ours.attn.k.detach()
                base_pattern = model.attention_pattern(l, q, k, ctx)
                new = {}
                if "pattern" in self.sites:  # equal lengths only (attribution checks): the donor's own pattern
                    new["pattern"] = model.attention_pattern(l, theirs.attn.q, theirs.attn.k, ctx)
                if fix_qk and "q" in self.sites:
                    new["q"] = model.attention_pattern(l, at.donor_at_base(theirs.attn.q, q), k, ctx)
                if fix_qk and "k" in self.sites:
                    new["k"] = model.attention_pattern(l, q, at.donor_at_base(theirs.attn.k, k), ctx)
                self.moved.update({Site(l, "attn", field=name): pattern - base_pattern
                                   for name, pattern in new.items()})

    def __call__(self, grads: dict[Site, Tensor], dropped: int | None = None) -> dict[Site, Tensor]:
        """{site: effect [batch]} for each write, head and head input of the chosen kinds, and {resid_pre site of a
        layer: [batch pos]} (the effect at each position). With `dropped`, the sites of that layer get zero
        (their gradient ran through its writes)."""
        out: dict[Site, Tensor] = {}
        for l, (ours, theirs) in enumerate(zip(self.base.layers, self.donor.layers)):
            for site, effect in self._layer(l, ours.attn, theirs.attn, ours, theirs, grads).items():
                out[site] = effect * 0 if l == dropped else effect
        if "resid_pre" in self.sites:
            if Site(0, "resid_pre") not in self.deltas:  # the streams are summed once, not per backward pass
                for (l, resid), (_, donor) in zip(self.base.entering(), self.donor.entering()):
                    self._delta(Site(l, "resid_pre"), donor, resid)
            for l in range(len(self.base.layers)):
                site = Site(l, "resid_pre")
                grad = grads[EMBED] if l == 0 else grads[Site(l - 1, "mlp")]
                out[site] = (self.deltas[site] * grad).sum(-1)
        return out

    def _layer(self, l: int, attn, donor_attn, ours, theirs, grads) -> dict[Site, Tensor]:
        """This layer's effects [batch], per write and per head (or key/value head) site."""
        mask, found = self.mask, {}
        if "sublayer" in self.sites:
            for part in ("attn", "mlp"):
                site = Site(l, part)
                delta = self._delta(site, getattr(theirs, part).out, getattr(ours, part).out)
                found[site] = (delta * grads[site] * mask).sum((1, 2))
        per_head: dict[str, Tensor] = {}  # [batch head] (or [batch kv_head]) per kind of head site
        z = Site(l, "attn", field="z")
        if "head" in self.sites:
            per_head["head"] = (self._delta(z, donor_attn.z, attn.z) * grads[z] * mask[..., None]).sum((1, 3))
        for name in ("q", "k", "v"):
            if name in self.sites and (name == "v" or not self.fix_qk):
                site = Site(l, "attn", field=name)
                delta = self._delta(site, getattr(donor_attn, name), getattr(attn, name))
                per_head[name] = (delta * grads[site] * mask[..., None]).sum((1, 3))
        pattern_sites = [s for s in ("q", "k", "pattern") if s in self.sites and (s == "pattern" or self.fix_qk)]
        if pattern_sites:
            rule = self.model.blocks[l].attn.score_rule  # query head h reads key/value head rule.kv_head(h)
            v = rule.repeat_kv(attn.v.detach(), dim=2)  # [batch key head d_head]
            grad = torch.einsum("bihd,bjhd->bhij", grads[z], v) * mask[:, None]  # [batch head pos key]
            for name in pattern_sites:
                effect = (self.moved[Site(l, "attn", field=name)] * grad).sum((2, 3))
                per_head[name] = effect.view(len(effect), -1, rule.group).sum(-1) if name == "k" else effect
        for name, effect in per_head.items():
            for h, column in enumerate(effect.unbind(1)):
                found[head_site(l, name, h)] = column
        return found

    def _delta(self, site: Site, donor: Tensor, base: Tensor) -> Tensor:
        """The patched minus the base value of a [batch pos ...] activation (aligned positions only), once."""
        if site not in self.deltas:
            self.deltas[site] = (self.at.donor_at_base(donor, base) - base.detach()).detach()
        return self.deltas[site]


def head_site(layer: int, kind: str, head: int) -> Site:
    """The site of a head word ("head", "q", "pattern": query head; "k", "v": key/value head)."""
    if kind == "head":
        return Site(layer, "attn", head=head)
    if kind in ("k", "v"):
        return Site(layer, "attn", kv_head=head, field=kind)
    return Site(layer, "attn", head=head, field=kind)
