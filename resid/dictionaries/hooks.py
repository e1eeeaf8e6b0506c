"""Hook points of dictionary files -> resid Sites.

A dictionary file names the tensor it reads (and, for a transcoder, the one it predicts) with the hook-point
convention of the library that trained it: TransformerLens hook names (SAELens, circuit-tracer) or Hugging Face
module paths with `.input` / `.output` (Gemma Scope 2; sparsify's module hookpoints, which resid writes the same
way). `hook_point(name, config)` says which resid Site holds that tensor, and how the tensor differs from what
the Site records, as flags of a `HookPoint`:

    TransformerLens (blocks.L.)            Hugging Face (model.layers.L. / layers.L. / h.L.)   resid Site
    hook_embed / hook_pos_embed (no layer) -                                                   Site(None, "embed")
    hook_resid_pre                         .input                                              Site(L, "resid_pre")
    hook_resid_mid                         -                                                   Site(L, "resid_mid")
    hook_resid_post                        .output                                             Site(L, "resid_post")
    hook_mlp_in (resid_pre if parallel)    -                                                   Site(L, "resid_mid")
    hook_attn_out                          self_attn.output / attn.output / attention.output   Site(L, "attn") *
    hook_mlp_out                           mlp.output                                          Site(L, "mlp") *
    -                                      post_feedforward_layernorm.output (post-norms)      Site(L, "mlp")
    ln2.hook_normalized                    -                                                   mlp normalized (std.)
    mlp.hook_in (circuit-tracer)           pre_feedforward_layernorm.output, mlp.input, ln_2   mlp normalized
    mlp.hook_out (circuit-tracer)          mlp.output                                          Site(L, "mlp") *
    attn.hook_z                            self_attn.o_proj.input                              attn z, heads flattened
    ln1.hook_normalized                    -                                                   attn normalized (std.)
    -                                      input_layernorm.output, ln_1.output                 attn normalized

(std.): standardized, see HookPoint. `post_attention_layernorm.output` is the MLP's input norm in Llama-like
models and the attention's post-norm in Gemma 2/3 (the attention write, `Site(L, "attn")`), so that name needs
the model's config.

(*) Models with post-norms (Gemma 2/3, OLMo 2) write a sublayer's output through a norm; resid's `out` is after
it, as TransformerLens's hook_mlp_out. The Hugging Face module output `mlp.output` and circuit-tracer's
`mlp.hook_out` are before it: such a HookPoint has `before_post_norm=True`.
"""

import dataclasses
import re
from dataclasses import dataclass

from torch import Tensor

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.sites import Site, transformerlens
from resid.sites.transformerlens import BLOCK


@dataclass(frozen=True)
class HookPoint:
    """Where a dictionary's hook reads in a resid run, and how the tensor differs from the Site's record.

    standardized      the tensor is the site's norm output before the norm's gain and bias, centre(x) * scale
                      (TransformerLens `ln2.hook_normalized`); resid's `normalized` field is after the gain and
                      bias (what the sublayer reads). `block.ln_mlp.standardized(resid, norm_scale)` computes it.
    heads_flat        the tensor is the site's [batch pos head d_head] with heads flattened head-major into one
                      [batch pos (head d_head)] axis (TransformerLens `attn.hook_z` z-SAEs, Hugging Face
                      `o_proj.input`).
    before_post_norm  the tensor is the sublayer's output before its post-norm (only differs in models with
                      post-norms); resid's `out` is after it.
    With every flag False the tensor is exactly `run.read(site)`.
    """

    name: str  # the hook as the dictionary file writes it
    site: Site
    standardized: bool = False
    heads_flat: bool = False
    before_post_norm: bool = False

    def norm(self, model):
        """The norm whose output the site is (a sublayer's input norm), for a standardized point."""
        block = model.blocks[self.site.layer]
        return {"attn": block.ln_attn, "mlp": block.ln_mlp, "cross": block.ln_cross}[self.site.part]

    def view(self, value: Tensor, model) -> Tensor:
        """The tensor this point means, from the slice a Hook at its site gets inside the pass."""
        if self.heads_flat:
            return value.flatten(-2)
        if self.standardized:
            return self.norm(model).to_standardized(value)
        return value

    def unview(self, tensor: Tensor, like: Tensor, model) -> Tensor:
        """The slice of the Hook's site holding `tensor` (the inverse of view), in the slice's dtype."""
        if self.heads_flat:
            return tensor.reshape(like.shape).to(like.dtype)
        if self.standardized:
            tensor = self.norm(model).from_standardized(tensor)
        return tensor.to(like.dtype)


# Hugging Face module paths: an optional model prefix, the layer list, then a module path and .input/.output
_HF = re.compile(r"(?:model\.language_model\.|model\.|transformer\.|gpt_neox\.)?(?:layers|h)\.(\d+)(?:\.(.+))?\."
                 r"(input|output)")


def hook_point(name: str, config: ModelConfig | None, head: int | None = None) -> HookPoint | None:
    """The HookPoint of a hook name (see the module docstring), checked against `config` when given; None when
    the name is one that needs a config to map (post_attention_layernorm, hook_mlp_in, mlp.hook_pre) and none is
    given. `head` is SAELens's hook_head_index: the hook reads one head of a head-indexed tensor. Raises a
    ResidError naming the hook when it maps to no site of resid (or of this model)."""
    layer, rows = transformerlens.rows(name)
    tensorlens = bool(rows) or BLOCK.fullmatch(name) is not None
    found = _tensorlens(name, layer, rows, config, head) if tensorlens else _huggingface(name, config)
    if found is None:
        if tensorlens or _HF.fullmatch(name):
            return None
        raise ResidError(f"Hook point {name!r} is not a name resid maps to a site: it reads TransformerLens names "
                         "like 'blocks.3.hook_resid_post' and Hugging Face module paths like "
                         "'model.layers.3.output' (resid.dictionaries.hooks lists them).")
    return _check(found, config) if config is not None else found


def _tensorlens(name: str, layer: int | None, rows: list, config: ModelConfig | None,
                head: int | None) -> HookPoint | None:
    """A TransformerLens-style name through the one table (resid.sites.transformerlens): a row with a Site, read
    as recorded, standardized (ln*.hook_normalized) or before the post-norm (circuit-tracer's mlp.hook_out)."""
    rows = [row for row in rows if row.part is not None and row.reads != "reciprocal"]
    if config is not None and rows:
        known = transformerlens.facts(config)
        fitting = [row for row in rows if transformerlens.has(row, known)]
        if not fitting:
            raise ResidError(f"Hook point {name!r} reads a tensor this model does not have: {rows[0].note}.")
        rows = fitting
    if not rows:
        raise ResidError(f"Hook point {name!r} is a TransformerLens name resid does not map to a site; dictionaries "
                         "can read hook_resid_pre/mid/post, hook_mlp_in, hook_attn_out, hook_mlp_out, "
                         "ln1/ln2.hook_normalized, attn.hook_z/q/k/v, mlp.hook_post/pre.")
    if len({(row.part, row.field) for row in rows}) > 1:
        return None  # only the model says which (parallel blocks' hook_mlp_in; a gated MLP's hook_pre)
    row = rows[0]
    if row.unit is not None and row.unit != "neuron" and head is None:
        if row.field != "z":
            raise ResidError(f"Hook point {name!r} reads a per-head tensor; resid maps it only with SAELens's "
                             "hook_head_index (one head). Whole-z SAEs read 'attn.hook_z'.")
        return HookPoint(name, Site(layer, row.part, field="z"), heads_flat=True)
    units = {} if head is None or row.unit is None else {row.unit: head}
    return HookPoint(name, Site(layer, row.part, field=row.field, **units),
                     standardized=row.reads == "standardized", before_post_norm=row.reads == "before_post_norm")


# (module path after the layer, input/output) -> what it reads; "norm_out:mlp" etc. resolved below
_HF_MODULES = {
    (None, "input"): "resid_pre",
    (None, "output"): "resid_post",
    ("self_attn", "output"): "attn_raw", ("attn", "output"): "attn_raw", ("attention", "output"): "attn_raw",
    ("mlp", "output"): "mlp_raw",
    ("mlp", "input"): "mlp_normalized",
    ("pre_feedforward_layernorm", "output"): "mlp_normalized",
    ("ln_2", "output"): "mlp_normalized",
    ("input_layernorm", "output"): "attn_normalized",
    ("ln_1", "output"): "attn_normalized",
    ("post_feedforward_layernorm", "output"): "mlp_post_norm",
    ("post_attention_layernorm", "output"): "post_attention_layernorm",
    ("self_attn.o_proj", "input"): "z", ("attn.c_proj", "input"): "z", ("attention.dense", "input"): "z",
}


def _huggingface(name: str, config: ModelConfig | None) -> HookPoint | None:
    match = _HF.fullmatch(name)
    if match is None:
        return None
    layer, module, end = int(match[1]), match[2], match[3]
    kind = _HF_MODULES.get((module, end))
    if kind is None:
        raise ResidError(f"Hook point {name!r}: resid does not map the Hugging Face module {module!r} ({end}) to a "
                         "site; known modules are the decoder layer itself, self_attn, mlp, the layer norms and "
                         "self_attn.o_proj.input (resid.dictionaries.hooks).")
    if kind == "mlp_post_norm" and config is not None and not config.post_norms:
        raise ResidError(f"Hook point {name!r} reads the MLP's post-norm, which this model does not have (only "
                         "models with post-norms, e.g. Gemma 2/3, do).")
    if kind == "post_attention_layernorm":
        if config is None:
            return None
        # Gemma 2/3 name their attention post-norm so; Llama-like models their MLP input norm
        kind = "attn" if config.post_norms else "mlp_normalized"
    table = {
        "resid_pre": HookPoint(name, Site(layer, "resid_pre")),
        "resid_post": HookPoint(name, Site(layer, "resid_post")),
        "attn_raw": HookPoint(name, Site(layer, "attn"), before_post_norm=True),
        "mlp_raw": HookPoint(name, Site(layer, "mlp"), before_post_norm=True),
        "attn": HookPoint(name, Site(layer, "attn")),
        "mlp_post_norm": HookPoint(name, Site(layer, "mlp")),
        "mlp_normalized": HookPoint(name, Site(layer, "mlp", field="normalized")),
        "attn_normalized": HookPoint(name, Site(layer, "attn", field="normalized")),
        "z": HookPoint(name, Site(layer, "attn", field="z"), heads_flat=True),
    }
    return table[kind]


def _check(point: HookPoint, config: ModelConfig) -> HookPoint:
    """The hook point with its site checked against this model (layer in range, no resid_mid in parallel blocks,
    a norm output only where there are pre-norms); `before_post_norm` is dropped where the model has no
    post-norms (there the tensor is the write itself)."""
    site = point.site
    try:
        site = site.resolve(config)
    except ResidError as err:
        raise ResidError(f"Hook point {point.name!r} reads {site.label}, which this model does not have: "
                         f"{err}") from None
    if site.field == "normalized" and not config.pre_norms:
        raise ResidError(f"Hook point {point.name!r} reads a norm's output before the sublayer, but this model's "
                         "sublayers read the residual without a pre-norm.")
    return dataclasses.replace(point, site=site, before_post_norm=point.before_post_norm and config.post_norms)


def width(point: HookPoint, config: ModelConfig) -> int:
    """The last-axis width of the tensor the hook reads in this model (what d_in / d_out must equal)."""
    site = point.site
    if site.head is not None or site.kv_head is not None:  # latent attention's values (and z) are narrower
        return config.v_width if site.what in ("z", "v") else config.d_head
    if site.field == "z":  # heads flattened
        return config.n_heads * config.v_width
    if site.field in ("post", "pre", "gate"):
        return config.d_mlp if site.layer is None else config.mlp_width(site.layer)
    return config.d_model


def read(run, model, point: HookPoint) -> Tensor:
    """The tensor `point` means, from a resid run (captured with the site's field): run.read(site), heads
    flattened for `heads_flat`, the norm's standardized input for `standardized`. A `before_post_norm` tensor is
    not recorded by resid (its `out` is after the post-norm): that raises."""
    site = point.site
    if point.before_post_norm:
        raise ResidError(f"{point.name!r} is {site.label} before its post-norm, which resid does not record (it "
                         "records the write after the post-norm).")
    if point.standardized:
        stream = run.stream
        reads = stream.read(model.blocks[site.layer].reads(site.part))
        record = getattr(stream.layers[site.layer], site.part)
        return point.norm(model).standardized(reads, record.norm_scale)
    value = run.read(site)
    return value.flatten(-2) if point.heads_flat else value



def point_of(site: Site, config: ModelConfig, standardized: bool = False) -> HookPoint:
    """The HookPoint that reads `site` in a model of `config`, named by the TransformerLens hook a dictionary file
    writes for that tensor: the first row of resid.sites.transformerlens's table this model has that reads the site's
    part and field as recorded, or standardized (a norm's output before its gain and bias: ln1 / ln2.hook_normalized).
    hook_point's inverse, checked by the round trip."""
    site = site.resolve(config)
    field = None if site.what in ("out", "resid", "write") else site.what  # the table's None: the tensor itself
    reads = "standardized" if standardized else "record"
    known = transformerlens.facts(config)
    rows = [row for row in transformerlens.TABLE if (row.part, row.field, row.reads) == (site.part, field, reads)
            and row.layered == (site.layer is not None) and transformerlens.has(row, known)]
    if not rows or site.positions is not None or site.stack is not None or site.of_dictionary:
        how = "standardized (before a norm's gain: field='normalized' only) " if standardized else ""
        raise ResidError(f"A dictionary cannot read {site.label} {how}in {config.architecture}: it reads a decoder's "
                         "tensors at every position that have a TransformerLens hook name (resid.sites.transformerlens "
                         "lists them).")
    point = hook_point(rows[0].full(site.layer), config, head=site.unit)
    if point is None or point.site != site or point.standardized != standardized:
        raise ResidError(f"{site.label} has no hook name that reads it as a dictionary does "
                         "(resid.sites.transformerlens lists the names).")
    return point
