"""TransformerLens's hook names: the one table of them, and the conversions both ways.

Every TransformerLens name resid knows is a row of `TABLE`, in forward order: the name (after `blocks.{l}.` for a
layer's), the Site part and field it reads, how TransformerLens's tensor is made from resid's record (`READS`), which
models have it (`HAS`) and what it is to resid (`ROLES`). Everything that speaks TransformerLens derives from it:
`Site.hook_name` / `Site.from_hook_name` (resid.sites.site), the read-only view of a run by hook names
(resid.hook_names), the hook points of dictionary files (resid.dictionaries.hooks). `BLOCK` is the one pattern of a
layer's name. This module knows no Site (it gives parts and fields, of resid.sites.vocabulary), so resid.sites.site
can import it.
"""

import re
from dataclasses import dataclass

from resid.config import ModelConfig
from resid.sites.vocabulary import UNIT_OF

BLOCK = re.compile(r"blocks\.(-?\d+)\.(.+)")  # a layer's name: blocks.{layer}.{name}


def at_layer(layer: int, name: str) -> str:
    """The whole name of a layer's `name` ("hook_resid_pre" at 3: "blocks.3.hook_resid_pre"), BLOCK's inverse."""
    return f"blocks.{layer}.{name}"


# How TransformerLens's tensor is made from the record of the row's Site
READS = {
    "record": "the site's tensor as resid records it",
    "reciprocal": "1 / the record: TransformerLens's ln*.hook_scale is sigma (or rms), resid records 1/sigma",
    "standardized": "the norm's output before its gain and bias, centre(x) * scale (resid's `normalized` is after)",
    "before_post_norm": "the sublayer's output before its post-norm, which resid does not record (its `out` is after)",
}
# Which models have a name: facts of the config that must all hold, each possibly negated ("not rotary")
HAS = ("rotary", "learned", "gated", "dense", "experts", "pre_norms", "post_norms", "parallel")
# What a name is to resid: offered by the view of a run; read only by dictionary files; not recorded (the view says
# what to read instead)
ROLES = ("view", "dictionary", "unrecorded")


@dataclass(frozen=True)
class Name:
    """One row of TABLE (see the module docstring)."""

    name: str  # after "blocks.{l}." when `layered`, else whole
    part: str | None  # the Site part it reads; None: no Site (the final norm's names, unrecorded names)
    field: str | None = None  # the Site field; None: the residual itself, or the sublayer's write
    reads: str = "record"
    has: tuple[str, ...] = ()
    role: str = "view"
    note: str = ""  # why the view does not offer it, and what to read instead
    layered: bool = True

    def full(self, layer: int | None) -> str:
        """The whole name at `layer`: "blocks.{layer}.{name}" for a layer's name, the name itself for a global one."""
        return at_layer(layer, self.name) if self.layered else self.name

    @property
    def unit(self) -> str | None:
        """The axis an index picks within the tensor (SAELens's hook_head_index, Site.from_hook_name's index)."""
        return UNIT_OF.get(self.field)


_POST_NORM = ("post_norms",)
_PRE_NORM = ("pre_norms",)
_EXPERTS_PRE = "each expert has its own MLP: read stream.layers[l].mlp.post, expert_weights and expert_out"
_SAME_AS_RESID_PRE = "it is hook_resid_pre (resid keeps no per-head copies)"
TABLE = (
    Name("hook_embed", "embed", layered=False),
    Name("hook_pos_embed", "pos_embed", has=("learned",), layered=False,
         note="this model has rotary positions, no positional embedding write"),
    Name("hook_resid_pre", "resid_pre"),
    Name("ln1.hook_scale", "attn", "norm_scale", "reciprocal", _PRE_NORM,
         note="this model's sublayers read the residual without a pre-norm"),
    Name("ln1.hook_normalized", "attn", "normalized", "standardized", _PRE_NORM,
         note="this model's sublayers read the residual without a pre-norm"),
    # hook_q / hook_k are the projections before any q/k norm and rotary (resid's q_proj / k_proj, which are q / k
    # in models with neither); hook_rot_q / hook_rot_k what the scores read (resid's q / k). So
    # Site(l, "attn", field="q").hook_name is hook_rot_q, TransformerLens's name for it in rotary models.
    Name("attn.hook_q", "attn", "q_proj"),
    Name("attn.hook_k", "attn", "k_proj"),
    Name("attn.hook_v", "attn", "v"),
    Name("attn.hook_rot_q", "attn", "q", has=("rotary",),
         note="this model has no rotary embedding: its queries are attn.hook_q"),
    Name("attn.hook_rot_k", "attn", "k", has=("rotary",),
         note="this model has no rotary embedding: its keys are attn.hook_k"),
    Name("attn.hook_attn_scores", "attn", "scores"),
    Name("attn.hook_pattern", "attn", "pattern"),
    Name("attn.hook_z", "attn", "z"),
    Name("ln1_post.hook_scale", "attn", "post_norm_scale", "reciprocal", _POST_NORM,
         note="this model has no post-norms"),
    Name("hook_attn_out", "attn"),
    Name("hook_resid_mid", "resid_mid", has=("not parallel",),
         note="parallel blocks have no resid_mid: both sublayers read resid_pre"),
    Name("ln2.hook_scale", "mlp", "norm_scale", "reciprocal", _PRE_NORM,
         note="this model's sublayers read the residual without a pre-norm"),
    Name("ln2.hook_normalized", "mlp", "normalized", "standardized", _PRE_NORM,
         note="this model's sublayers read the residual without a pre-norm"),
    # Gated MLPs: TransformerLens's hook_pre is the gate's input (resid's `gate`), hook_pre_linear the up branch
    # (resid's `pre`, the key scores as in a plain MLP). Site(l, "mlp", field="pre").hook_name is hook_pre_linear.
    Name("mlp.hook_pre_linear", "mlp", "pre", has=("dense", "gated"),
         note="it is the up branch of a gated dense MLP; this model's MLP is not one (a plain MLP's only input is "
              "mlp.hook_pre)"),
    Name("mlp.hook_pre", "mlp", "gate", has=("dense", "gated"), note=_EXPERTS_PRE),
    Name("mlp.hook_pre", "mlp", "pre", has=("dense", "not gated"), note=_EXPERTS_PRE),
    Name("mlp.hook_post", "mlp", "post", has=("dense",),
         note="each expert has its own coefficients: read stream.layers[l].mlp.post [batch pos expert d_mlp] (and "
              "expert_weights, expert_out)"),
    Name("mlp.hook_expert_weights", "mlp", "expert_weights", has=("experts",)),
    Name("ln2_post.hook_scale", "mlp", "post_norm_scale", "reciprocal", _POST_NORM,
         note="this model has no post-norms"),
    Name("hook_mlp_out", "mlp"),
    Name("hook_resid_post", "resid_post"),
    Name("ln_final.hook_scale", None, reads="reciprocal", layered=False),
    Name("ln_final.hook_normalized", None, reads="standardized", layered=False),
    # Read by dictionary files: TransformerLens's optional hook_mlp_in (use_hook_mlp_in) and circuit-tracer's
    # replacement MLP's hooks (its transcoders' input, after the norm's gain, and output, before a post-norm)
    Name("hook_mlp_in", "resid_mid", has=("not parallel",), role="dictionary",
         note="it is hook_resid_mid (hook_resid_pre in parallel blocks)"),
    Name("hook_mlp_in", "resid_pre", has=("parallel",), role="dictionary",
         note="it is hook_resid_mid (hook_resid_pre in parallel blocks)"),
    Name("mlp.hook_in", "mlp", "normalized", role="dictionary", note="a name of circuit-tracer's replacement MLP"),
    Name("mlp.hook_out", "mlp", reads="before_post_norm", role="dictionary",
         note="a name of circuit-tracer's replacement MLP"),
    # TransformerLens names resid does not record
    Name("attn.hook_result", None, role="unrecorded",
         note="per-head writes are not stored: resid.heads.head_results(run, model) computes them from attn.hook_z "
              "and W_O on demand, stacked (TransformerLens's stack_head_results)"),
    Name("hook_attn_in", None, role="unrecorded", note=_SAME_AS_RESID_PRE),
    Name("hook_q_input", None, role="unrecorded", note=_SAME_AS_RESID_PRE),
    Name("hook_k_input", None, role="unrecorded", note=_SAME_AS_RESID_PRE),
    Name("hook_v_input", None, role="unrecorded", note=_SAME_AS_RESID_PRE),
)


def facts(config: ModelConfig) -> dict[str, bool]:
    """The HAS facts of a model."""
    return {"rotary": config.positions == "rotary",
            "learned": config.positions in ("learned", "sinusoidal"), "gated": config.gated_mlp,
            # DeepSeek has both: dense first layers, then mixtures (a read at a layer of the other kind says so)
            "dense": config.n_experts == 0 or config.n_dense_layers > 0,
            "experts": config.n_experts > 0 and config.n_dense_layers < config.n_layers, "pre_norms": config.pre_norms,
            "post_norms": config.post_norms, "parallel": config.block == "parallel"}


def has(row: Name, known: dict[str, bool]) -> bool:
    """Whether a model with these facts has the row's name."""
    return all(known[fact.removeprefix("not ")] != fact.startswith("not ") for fact in row.has)


def rows(name: str) -> tuple[int | None, list[Name]]:
    """(the layer, the rows) of a full hook name ("blocks.3.attn.hook_z", "hook_embed"); no rows if it is none."""
    match = BLOCK.fullmatch(name)
    if match is None:
        return None, [row for row in TABLE if not row.layered and row.name == name]
    return int(match[1]), [row for row in TABLE if row.layered and row.name == match[2]]


def name_of(layer: int | None, part: str, field: str | None) -> str | None:
    """The TransformerLens name of a Site's part and field (its first row, so `q` is attn.hook_q and `pre`
    mlp.hook_pre_linear whatever the model), or None when TransformerLens has none."""
    for row in TABLE:
        if row.role == "view" and row.reads == "record" and (row.part, row.field) == (part, field):
            return row.full(layer)
    return None


def of_model(config: ModelConfig, role: str = "view") -> list[Name]:
    """The rows of a model's names of one role, in forward order (each name once)."""
    known = facts(config)
    found: dict[str, Name] = {}
    for row in TABLE:
        if row.role == role and has(row, known):
            found.setdefault(row.name, row)
    return list(found.values())
