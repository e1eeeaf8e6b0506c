"""Interventions on the features of learned dictionaries: the typed interventions of resid.interventions at
`Site(layer, part, feature=i)`, the site the dictionary reconstructs and one of its features.

    ZeroAblate(Site(3, "resid_post", feature=12))             feature 12 stops writing
    Scale(Site(3, "resid_post", feature=12), 2.0)             writes twice as much
    Replace(Site(3, "resid_post", feature=12), value)         its activation set to `value` (a mean, a donor's)
    Add(Site(3, "resid_post", feature=12), torch.tensor(4.0)) steering: 4 * W_dec[12] more, wherever it is
    Hook(Site(1, "mlp", feature=7), fn)                       any function of the activation [batch pos]

The slice an edit sees is the feature's activation [batch pos] (pos: the Site's positions if it names some).
Inside the pass the dictionary splices its site: the tensor there becomes itself plus what the edit changes in
the reconstruction, decode(edited) - decode(acts) (the error term kept, so the rest of the tensor is untouched;
resid.dictionaries.attach). Every edit of one dictionary is applied in one splice, in the order given.

`feature_splices(model, dictionaries, interventions)` turns the feature interventions into the splices that do this
and passes the others through; resid.dictionaries.attach.feature_edits makes those splices Hooks, for
`model.run(dictionaries=[...], interventions=[...])` and any code that runs the model with interventions (the
intervention-sweep engine, resid.analyses.sweeps, for `model.resume`).
"""

from collections.abc import Sequence

import torch
from torch import Tensor

from resid.dictionaries.check import check
from resid.dictionaries.dictionary import Dictionary
from resid.dictionaries.modes import Observe, Splice
from resid.errors import ResidError
from resid.interventions import Add, Hook, Intervention, Replace, Scale, ZeroAblate
from resid.sites import Site
from resid.tokenizer import Tokens


def feature_splices(model, dictionaries: Sequence,
                    interventions: Sequence[Intervention]) -> tuple[list[Intervention], list[Splice]]:
    """(the interventions that are not on dictionary features, one Splice per dictionary whose features the others
    edit, applying them in the order given); see the module docstring."""
    plain, grouped = [], {}
    for iv in interventions:
        site = getattr(iv, "site", None)
        if isinstance(site, Site) and site.of_dictionary:
            if not isinstance(iv, (ZeroAblate, Replace, Scale, Add, Hook)):
                raise ResidError(f"Unknown intervention {iv!r} on {site.label}: use resid.ZeroAblate, Replace, Scale, "
                                 "Add or Hook.")
            d = find(model, dictionaries, site)
            grouped.setdefault(d.name, (d, []))[1].append(iv)
        else:
            plain.append(iv)
    return plain, [Splice(d, edit=_editor(edits)) for d, edits in grouped.values()]


def find(model, dictionaries: Sequence, site: Site) -> Dictionary:
    """The dictionary of `dictionaries` that reconstructs the site a feature site names (by layer and part)."""
    if site.feature is None:
        raise ResidError(f"{site.label}: interventions on a dictionary edit its features, Site(..., feature=i); its "
                         "error term and reconstruction are read-only.")
    site = site.resolve(model.config)
    found = []
    for item in dictionaries:
        d = item.dictionary if isinstance(item, (Observe, Splice)) else item
        if not isinstance(d, Dictionary) or site.dictionary not in (None, d.name):
            continue
        if d.point_in is None:
            d = check(d, model)
        at = d.point_out.site
        if (at.layer, at.part) == (site.layer, site.part):
            found.append(d)
    if len(found) != 1:
        names = ", ".join(repr(d.name) for d in found)
        what = f"several do ({names}): name it, Site(..., dictionary=name)" if found else \
            "none of the dictionaries given does: pass it, model.run(..., dictionaries=[dictionary])"
        raise ResidError(f"{site.label} names a feature of the dictionary reconstructing {site.reconstructed.label}, "
                         f"and {what}.")
    d = found[0]
    if site.feature >= d.d_sae:
        raise ResidError(f"{site.label}: dictionary {d.name!r} has {d.d_sae} features (0..{d.d_sae - 1}).")
    return d


def named(d: Dictionary, dictionaries: Sequence) -> str | None:
    """The `dictionary` of the Sites of d's features and terms among `dictionaries`: d's name where another of them
    reconstructs the same site (so that their labels never collide), else None (the label names the site alone)."""
    others = [item.dictionary if isinstance(item, (Observe, Splice)) else item for item in dictionaries]
    at = d.point_out.site.reconstructed
    clash = any(isinstance(o, Dictionary) and o.name != d.name and o.point_out is not None
                and o.point_out.site.reconstructed == at for o in others)
    return d.name if clash else None


def feature_site(d: Dictionary, feature: int, among: Sequence = ()) -> Site:
    """Feature `feature` of `d` as a Site: the site d reconstructs, with the feature, naming d where another
    dictionary `among` reconstructs that site too (named), so that find(model, among, site) gives d back."""
    at = d.point_out.site
    return Site(at.layer, at.part, feature=int(feature), dictionary=named(d, among))


def _editor(edits: list[Intervention]):
    """fn(acts, tokens) applying `edits` to their features' activations [batch pos] at their positions."""

    def edit(acts: Tensor, tokens: Tokens) -> Tensor:
        acts = acts.clone()
        rows = torch.arange(acts.shape[0], device=acts.device)[:, None]
        for iv in edits:
            site = iv.site
            index = (slice(None), slice(None)) if site.positions is None else (
                rows, tokens.padded_index(site.positions).to(acts.device))
            region = (*index, site.feature)
            acts[region] = iv.edit(acts[region], tokens) if isinstance(iv, Hook) else iv.edit(acts[region])
        return acts

    return edit
