"""Reading a Site from its spellings: its label (`Site.parse`, the inverse of `Site.label`) and TransformerLens hook
names both ways (`Site.hook_name`, `Site.from_hook_name`: one table, its inverse derived from it; hook_rot_q /
hook_rot_k read q / k, which resid records after rotary)."""

import dataclasses
import re

from resid.errors import ResidError
from resid.sites import GLOBAL_PARTS, RESID_PARTS, Site

# (part, field) -> the hook's name within its block
HOOKS = {("attn", "out"): "hook_attn_out", ("mlp", "out"): "hook_mlp_out", ("attn", "z"): "attn.hook_z",
         ("attn", "q"): "attn.hook_q", ("attn", "k"): "attn.hook_k", ("attn", "v"): "attn.hook_v",
         ("attn", "pattern"): "attn.hook_pattern", ("mlp", "post"): "mlp.hook_post",
         ("mlp", "pre"): "mlp.hook_pre_linear", ("mlp", "gate"): "mlp.hook_pre"}
SITES = {name: where for where, name in HOOKS.items()} | {"attn.hook_rot_q": ("attn", "q"),
                                                          "attn.hook_rot_k": ("attn", "k")}
LABEL = re.compile(r"layers\[(?P<layer>-?\d+)\]"
          r"(?:\.(?P<part>resid_pre|resid_mid|resid_cross|resid_post|attn|cross|mlp)"
          r"(?P<units>(?:\.(?:head|kv_head|neuron|expert|feature)\[-?\d+\])*)(?:\.(?P<field>[a-zA-Z_]+))?)?")
UNIT = re.compile(r"\.(head|kv_head|neuron|expert|feature)\[(-?\d+)\]")
AXIS = {"z": "head", "q": "head", "pattern": "head", "k": "kv_head", "v": "kv_head"}  # else neuron


def hook_name(site: Site) -> str:
    if site.of_dictionary:
        raise ResidError(f"{site.label} belongs to a learned dictionary, which TransformerLens has no hook for.")
    if site.stack is not None:
        raise ResidError(f"{site.label} is an encoder site, which resid gives no TransformerLens hook name.")
    if site.part in ("embed", "pos_embed"):
        return f"hook_{site.part}"
    if site.part in RESID_PARTS and site.part != "resid_cross":
        return f"blocks.{site.layer}.hook_{site.part}"
    name = HOOKS.get((site.part, site.what))
    if name is None or site.expert is not None:
        raise ResidError(f"{site.label} has no TransformerLens hook name (resid.hook_names lists the names).")
    return f"blocks.{site.layer}.{name}"


def site_of(name: str, index: int | None = None) -> Site:
    if name in ("hook_embed", "hook_pos_embed"):
        return Site(None, name.removeprefix("hook_"))
    match = re.fullmatch(r"blocks\.(-?\d+)\.(.+)", name)
    if match is not None:
        layer, suffix = int(match[1]), match[2]
        if suffix in ("hook_resid_pre", "hook_resid_mid", "hook_resid_post"):
            return Site(layer, suffix.removeprefix("hook_"))
        if suffix in SITES:
            part, field = SITES[suffix]
            if field == "out":
                return Site(layer, part)
            units = {} if index is None else {AXIS.get(field, "neuron"): index}
            return Site(layer, part, field=field, **units)
    raise ResidError(f"{name!r} is not a TransformerLens hook name resid maps to a site (the residual stream, the "
                     "sublayer writes, attn.hook_z/q/k/v/pattern, mlp.hook_post/pre); see docs/hook_names.md.")


def parse(text: str) -> Site:
    if not isinstance(text, str):
        raise ResidError(f"Site.parse takes a site label such as 'layers[3].attn.head[5]', got {text!r}.")
    if text.startswith(("blocks.", "hook_")):
        return site_of(text)
    if text.strip().startswith("encoder."):  # the encoder's stack of an encoder-decoder model
        return dataclasses.replace(parse(text.strip().removeprefix("encoder.")), stack="encoder")
    body, _, at = text.strip().partition("@")
    positions = None
    if at:
        try:
            positions = tuple(int(p) for p in at.split(","))
        except ValueError:
            raise ResidError(f"Site label {text!r}: positions after '@' must be integers "
                             "like @-1 or @3,4.") from None
    if body in GLOBAL_PARTS:
        return Site(None, body, positions=positions)
    match = LABEL.fullmatch(body)
    if match is None:
        raise ResidError(f"{text!r} is not a site label: write e.g. 'layers[3].resid_pre', 'layers[3].attn', "
                         "'layers[3].attn.head[5]', 'layers[3].mlp.neuron[42]', 'embed' (resid.sites).")
    layer, part, units, field = match["layer"], match["part"], match["units"] or "", match["field"]
    found = dict((name, int(value)) for name, value in UNIT.findall(units))
    return Site(int(layer), part or "layer", positions=positions, field=field, **found)
