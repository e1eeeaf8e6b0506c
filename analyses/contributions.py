"""The contributions of a direct attribution (resid.analyses.attribution): every write's contribution to a direction
on the final residual (at one position, or pooled over positions), at the level of sublayers, heads, experts or
neurons, and the long table they make; `read_out` turns a vector read out of the final hidden state into such
a direction. See analyses/attribution.py for the algebra."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from resid.analyses import site_words
from resid.errors import ResidError
from resid.model import Transformer
from resid.readout import Direction
from resid.sites import Site
from resid.stream import ResidualStream


@dataclass(frozen=True)
class Contributions:
    """A group of components: their sites and their values [batch m]; `sources`, for rows read through a
    cross-attention head, the encoder component each row carries (resid.analyses.source_side), else None."""

    sites: Sequence[Site]
    values: Float[Tensor, "batch m"]
    sources: Sequence[str] | None = None


@lru_cache(maxsize=256)
def unit_sites(layer: int, part: str, unit: str, count: int) -> tuple[Site, ...]:
    """The sites of every head / neuron / expert of a sublayer (made once: a model has many neurons)."""
    return tuple(Site(layer, part, **{unit: i}) for i in range(count))


def contributions(model: Transformer, stream: ResidualStream, direction: Direction, level: str,
                  cross: Callable | None = None) -> list[Contributions]:
    """Every component's contribution to `direction`, a read-out at the stream's captured positions (its vector
    [batch pos d_model], one row per captured position; the contributions are summed over them).

    Post-LN models norm the residual after every write, so the direction changes along the stream: it is pulled
    back through each norm (scale frozen) from the last layer down, and each write is read with the direction of
    the norm that follows it; each norm's bias is a row of its own (embed_norm_bias, resid_norm_bias).
    `cross(layer, record, direction)`, if given, gives the rows of each cross-attention sublayer's heads instead
    (the direction as the sublayer's output reads it; resid.analyses.source_side splits them by source)."""
    norms = stream.norms
    if _one_direction(model, stream, level, cross):
        return _embeds(stream, direction) + _layers_at_once(model, stream, direction, level)
    groups_by_layer = []
    for layer in reversed(range(len(stream.layers))):
        record = stream.layers[layer]
        bias_groups = []
        if norms is not None:
            direction, carried = direction.before_norm(norms.mlp[layer], record.mlp.resid_norm_scale)
            bias_groups.append(_bias(Site(layer, "mlp", field="resid_norm_bias"), carried))
        later = _mlp(model, record, direction, layer, level) + bias_groups
        for part in ("cross", "attn") if record.cross is not None else ("attn",):
            bias_groups = []
            written = getattr(record, part)
            if norms is not None:
                direction, carried = direction.before_norm(getattr(norms, part)[layer], written.resid_norm_scale)
                bias_groups.append(_bias(Site(layer, part, field="resid_norm_bias"), carried))
            later = _attn(model, written, direction, layer, level, part, cross) + bias_groups + later
        groups_by_layer.append(later)
    bias_groups = []
    if norms is not None and norms.embed is not None:
        direction, carried = direction.before_norm(norms.embed, stream.embed_norm_scale)
        bias_groups.append(_bias(Site(None, "embed_norm_bias"), carried))
    groups = [Contributions([Site(None, name)], direction.project(write)[:, None])
              for name, write in (("embed", stream.embed), ("pos_embed", stream.pos_embed),
                                  ("type_embed", stream.type_embed)) if write is not None]
    groups += bias_groups
    for layer_groups in reversed(groups_by_layer):
        groups += layer_groups
    return groups


def _embeds(stream: ResidualStream, direction: Direction) -> list[Contributions]:
    """The embeddings' rows (each embedding's write read with the direction at the bottom of the stream)."""
    return [Contributions([Site(None, name)], direction.project(write)[:, None])
            for name, write in (("embed", stream.embed), ("pos_embed", stream.pos_embed),
                                ("type_embed", stream.type_embed)) if write is not None]


def _one_direction(model: Transformer, stream: ResidualStream, level: str, cross: Callable | None) -> bool:
    """Whether every write is read with the same direction and split the same way in every layer (pre-LN, no
    post-norms, no cross-attention, no mixture of experts to split), so that the layers are computed at once."""
    blocks = [model.blocks[layer] for layer in range(len(stream.layers))]
    return (stream.norms is None and cross is None and all(record.cross is None for record in stream.layers)
            and all(b.ln_attn_post is None and b.ln_mlp_post is None for b in blocks)
            and (level == "sublayer" or model.config.n_experts == 0))


def _layers_at_once(model: Transformer, stream: ResidualStream, direction: Direction,
                    level: str) -> list[Contributions]:
    """Every layer's rows, as `_attn` and `_mlp` give them one layer at a time, from a few products over the layers
    stacked (the writes, z and W_O, post and W_out), in blocks of layers of at most LAYER_BLOCK_FLOATS: on a GPU a
    handful of kernels instead of a dozen per layer."""
    layers, blocks = stream.layers, [model.blocks[layer] for layer in range(len(stream.layers))]
    attn_split, mlp_split = level != "sublayer", level == "neuron"
    values: dict[str, Tensor] = {}  # name -> [batch layer ...]
    if attn_split:
        values["heads"] = _stacked(direction, [b.attn.W_O for b in blocks], [r.attn.z for r in layers])
        if blocks[0].attn.b_O is not None:
            values["b_O"] = _stacked(direction, [b.attn.b_O for b in blocks])
    else:
        values["attn"] = direction.project(torch.stack([r.attn.out for r in layers], -2))
    if mlp_split:
        values["neurons"] = _stacked(direction, [b.mlp.W_out for b in blocks], [r.mlp.post for r in layers])
        if blocks[0].mlp.b_out is not None:
            values["b_out"] = _stacked(direction, [b.mlp.b_out for b in blocks])
    else:
        values["mlp"] = direction.project(torch.stack([r.mlp.out for r in layers], -2))
    # (part, its unit, the values of its units, of its bias, split into units): each layer's groups in this order
    parts = (("attn", "head", "heads", "b_O", attn_split), ("mlp", "neuron", "neurons", "b_out", mlp_split))
    groups: list[Contributions] = []
    for layer in range(len(layers)):
        for part, unit, units, bias, split in parts:
            if not split:
                groups.append(Contributions([Site(layer, part)], values[part][:, layer, None]))
                continue
            found = values[units][:, layer]
            groups.append(Contributions(unit_sites(layer, part, unit, found.shape[1]), found))
            if bias in values:
                groups.append(_bias(Site(layer, part, field=bias), values[bias][:, layer]))
    return groups


LAYER_BLOCK_FLOATS = 1 << 26  # the float32 copies of one block of layers' weights (or activations): 256 MiB


def _stacked(direction: Direction, weights: list[Tensor], activations: list[Tensor] | None = None) -> Tensor:
    """[batch layer *unit]: each layer's weight ([*unit (d_in) d_model]: W_O [head d_head d_model], W_out [d_mlp
    d_model], a bias [d_model]) pulled back onto the direction, times the layer's activation ([batch pos *unit
    d_in]: z, post) and summed over d_in and the positions; without activations, the weight's own contribution
    at every position the direction reads. Layers in blocks of at most LAYER_BLOCK_FLOATS."""
    per_layer = max(weights[0].numel(), activations[0].numel() if activations else 0)
    step = max(1, LAYER_BLOCK_FLOATS // per_layer)
    out = []
    for start in range(0, len(weights), step):
        block = slice(start, start + step)
        stacked = torch.stack([w.float() for w in weights[block]])  # [layer *unit d_model]
        pulled = direction.through(stacked)  # [batch (pos) layer *unit]
        if activations is None:
            out.append(pulled.sum(1) if direction.vector.ndim == 3 else pulled)
            continue
        acts = torch.stack([a.float() for a in activations[block]], 2)  # [batch pos layer *unit]
        if direction.vector.ndim == 2:  # one read-out position: the activations at it, pos of size one
            pulled = pulled[:, None]
        products = acts * pulled
        out.append((products.sum(-1) if weights[0].ndim == 3 else products).sum(1))  # d_in (W_O's d_head), then pos
    return torch.cat(out, 1)


def _bias(site: Site, values: Float[Tensor, "batch"]) -> Contributions:
    return Contributions([site], values[:, None])


def _attn(model: Transformer, written, direction: Direction, layer: int, level: str, part: str,
          cross: Callable | None = None) -> list[Contributions]:
    """An attention sublayer's rows (self-attention, or a decoder's cross-attention: `part`): its write, or its
    heads (and output bias). `written` is its record."""
    block = model.blocks[layer]
    attn, post_norm = (block.attn, block.ln_attn_post) if part == "attn" else (block.cross, block.ln_cross_post)
    split = cross is not None and part == "cross"
    if level == "sublayer" and not split:
        return [Contributions([Site(layer, part)], direction.project(written.out)[:, None])]
    groups: list[Contributions] = []
    into = through_post_norm(post_norm, written, direction, layer, part, groups)
    if split:
        groups += cross(layer, written, into)
        if attn.b_O is not None:
            groups.append(_bias(Site(layer, part, field="b_O"), into.through(attn.b_O).sum(1)))
        return groups
    # z[h] . (W_O[h] @ u'): W_O pulled back onto the direction first, a [batch pos head d_head] tensor.
    heads = (written.z.float() * into.through(attn.W_O)).sum(-1).sum(1)
    groups.append(Contributions(unit_sites(layer, part, "head", heads.shape[1]), heads))
    if attn.b_O is not None:
        groups.append(_bias(Site(layer, part, field="b_O"), into.through(attn.b_O).sum(1)))
    return groups


def _mlp(model: Transformer, record, direction: Direction, layer: int, level: str) -> list[Contributions]:
    """The MLP sublayer's rows: its write, its experts, or its neurons (and output bias)."""
    mlp = model.blocks[layer].mlp
    moe = model.config.has_experts(layer)  # DeepSeek's first layers are dense
    if level == "sublayer" or (level == "head" and not moe):
        return [Contributions([Site(layer, "mlp")], direction.project(record.mlp.out)[:, None])]
    groups: list[Contributions] = []
    into = through_post_norm(model.blocks[layer].ln_mlp_post, record.mlp, direction, layer, "mlp", groups)
    if moe:
        groups.append(_experts(layer, record.mlp.post, record.mlp.expert_weights, mlp.W_out, into, level))
        if mlp.b_out is not None:  # gpt-oss: the experts' output biases, each weighted as its expert's write
            biases = (record.mlp.expert_weights.float() * into.through(mlp.b_out)).sum(-1).sum(1)
            groups.append(_bias(Site(layer, "mlp", field="b_out"), biases))
        return groups
    # post[i] * (W_out[i] . u')
    neurons = (record.mlp.post.float() * into.through(mlp.W_out)).sum(1)
    groups.append(Contributions(unit_sites(layer, "mlp", "neuron", neurons.shape[1]), neurons))
    if mlp.b_out is not None:
        groups.append(_bias(Site(layer, "mlp", field="b_out"), into.through(mlp.b_out).sum(1)))
    return groups


def _experts(
    layer: int,
    post: Float[Tensor, "batch pos expert d_mlp"],
    weights: Float[Tensor, "batch pos expert"],
    w_out: Float[Tensor, "expert d_mlp d_model"],
    into: Direction,
    level: str,
) -> Contributions:
    """A mixture of experts' rows: one per expert (level "head"), weight_e * (post_e . (W_out[e] @ u')), or one per
    (expert, neuron) (level "neuron"), weight_e * post_e[i] * (W_out[e, i] . u'). W_out is pulled back onto the
    direction first, a [batch pos expert d_mlp] tensor."""
    per_neuron = (weights.float()[..., None] * post.float() * into.through(w_out)).sum(1)
    n_experts, d_mlp = per_neuron.shape[1:]
    if level == "head":
        return Contributions(unit_sites(layer, "mlp", "expert", n_experts), per_neuron.sum(-1))
    sites = [Site(layer, "mlp", expert=e, neuron=i) for e in range(n_experts) for i in range(d_mlp)]
    return Contributions(sites, per_neuron.flatten(1))


def through_post_norm(norm, record, direction: Direction, layer: int, part: str, groups: list) -> Direction:
    """The direction as the sublayer's output (before its post-norm) reads it: pulled back through the
    post-norm with its scale frozen. A LayerNorm post-norm's bias becomes its own row. Without a post-norm,
    the direction itself."""
    if norm is None:
        return direction
    pulled, carried = direction.before_norm(norm, record.post_norm_scale)
    if norm.b is not None:
        groups.append(_bias(Site(layer, part, field="post_norm_bias"), carried))
    return pulled


def frame(meta: dict, blocks: list[Contributions], actual: Float[Tensor, "batch"],
          total: str = "logit") -> pd.DataFrame:
    """Long format (attribution.COLUMNS): every prompt of the chunk times every component; `total` names the
    column of the value the components sum to ("logit" for a token's logit (difference), "readout" for a probe)."""
    sites = [site for block in blocks for site in block.sites]
    values = torch.cat([b.values for b in blocks], dim=1).double().cpu().numpy()  # [batch m]
    batch, m = values.shape

    def per_prompt(name: str, dtype) -> np.ndarray:
        return np.repeat(np.asarray(meta[name], dtype=dtype), m)

    which = np.tile(np.arange(m), batch)  # each row's component: the site columns are made once, then taken
    site_columns = {name: np.asarray(column, dtype=object)[which] if name in ("site", "part") else column.take(which)
                    for name, column in site_words.columns(sites).items()}
    columns = {
        "prompt_idx": per_prompt("prompt_idx", np.int64),
        "pos": per_prompt("pos", np.int64),
        "token": per_prompt("token", str),
        "target": per_prompt("target", str),
        "target_id": per_prompt("target_id", np.int64),
        "baseline": per_prompt("baseline", object),
        "baseline_id": pd.array(np.repeat(np.asarray(meta["baseline_id"], dtype=object), m), dtype="Int64"),
        "site": site_columns["site"].astype(str),
        **{name: site_columns[name] for name in site_words.COLUMNS if name != "part"},
        "part": site_columns["part"].astype(str),
        "value": values.reshape(-1),
        total: np.repeat(actual.double().cpu().numpy(), m),
    }
    order = [*meta, "site", *site_words.COLUMNS, "value", total]
    return pd.DataFrame({name: columns[name] for name in dict.fromkeys(order)})


def read_out(
    model: Transformer, run, vector: Tensor, bias: Tensor, pooled: Tensor | None, normalize: bool
) -> tuple[Direction, Tensor]:
    """(the direction on the stream, the value) of `vector` [batch d_model] read out of run.hidden: at its one
    position, or, with `pooled` (the attention mask), out of the mean over the real positions (divided by that
    mean's length, frozen, if `normalize`)."""
    hidden = run.hidden.float()  # [batch k d_model]: k = 1, or every position when pooled
    weights = torch.ones(hidden.shape[:2], device=hidden.device)
    if pooled is not None:
        weights = pooled.float() / pooled.float().sum(1, keepdim=True)
        if normalize:  # the pooled vector's length, frozen like a norm's scale
            weights = weights / (weights[..., None] * hidden).sum(1).norm(dim=-1, keepdim=True)
    scale = run.stream.final_norm_scale
    rows = model.readout.direction((weights[..., None] * vector[:, None]).flatten(0, 1), scale.flatten(0, 1), None)
    direction = Direction(rows.vector.view(*hidden.shape), rows.bias.view(hidden.shape[:2]).sum(1) + bias)
    return direction, (weights[..., None] * hidden * vector[:, None]).sum((1, 2)) + bias


def probe_frame(
    model: Transformer, run, direction: Direction, actual: Tensor, meta: dict, level: str
) -> pd.DataFrame:
    """The frame of a read-out's components (and its final_bias row) for a run captured by `capture_for`."""
    groups = contributions(model, run.stream, direction, level)
    groups.append(_bias(Site(None, "final_bias"), direction.bias))
    return frame(meta, groups, actual, total="readout")


def check_probe(model: Transformer, probe, baseline, n: int, dictionaries=()) -> None:
    """A Probe target of attribution.direct: its vector's shape, no baseline, no dictionaries."""
    d_model = model.config.d_model
    if dictionaries:
        raise ResidError("Attribution of a Probe to dictionary features is not supported yet: attribute a token's "
                         "logit, or the Probe without dictionaries.")
    if baseline is not None:
        raise ResidError("A Probe target takes no baseline: put the difference into its vector (v1 - v2).")
    vector = probe.vector
    if not isinstance(vector, torch.Tensor) or vector.shape not in ((d_model,), (n, d_model)):
        shape = tuple(vector.shape) if isinstance(vector, torch.Tensor) else type(vector).__name__
        raise ResidError(
            f"Probe.vector must be a tensor of shape [d_model] = [{d_model}] or [n_prompts d_model] = [{n}, "
            f"{d_model}], got {shape}."
        )
