"""TransformerLens hook names as a read-only view of one run's typed stream: the bridge for TL users.

    names = resid.hook_names.view(run, model)
    names["blocks.3.hook_resid_pre"]        # run.stream.resid_pre(3)
    names["blocks.3.attn.hook_z"]           # run.stream.layers[3].attn.z
    list(names)                             # every name this model has, in forward order

The typed stream stays the primary interface; this view only renames it. Values are computed when read
(resid_pre/mid/post are sums of writes), and a name whose field was not captured raises the stream's own error,
which names the Capture option to set. The mapping, with where resid's fields differ, is docs/hook_names.md.

Where TransformerLens's conventions differ from resid's field names, the view follows TransformerLens:
- `ln*.hook_scale` is sigma (or rms), the reciprocal of resid's `norm_scale` (1/sigma).
- `ln*.hook_normalized` is (x - mean) / sigma (x / rms for RMSNorm) before the gain and bias; resid's
  `normalized` is after them (what the sublayer reads).
- gated MLPs: `mlp.hook_pre` is the gate's input (resid's `gate`), `mlp.hook_pre_linear` the up branch
  (resid's `pre`).
- rotary models: resid records q and k after the rotary embedding, TL's `attn.hook_rot_q` / `hook_rot_k`;
  TL's `attn.hook_q` / `hook_k` (before rotary) are not recorded.
- mixtures of experts (Mixtral): `mlp.hook_expert_weights` is the router's renormalized weights; the dense
  `mlp.hook_pre` / `hook_post` do not exist (each expert's are in `stream.layers[l].mlp`).
- post-norms (Gemma 2/3): `ln1_post.hook_scale` / `ln2_post.hook_scale` are the post-norms' sigma; models
  without pre-norms (OLMo 2) have no `ln1` / `ln2` names.
"""

import difflib
import re
from collections.abc import Callable, Iterator, Mapping

from torch import Tensor

from resid.errors import ResidError
from resid.model import Run, Transformer
from resid.stream import ResidualStream

# TransformerLens names (after "blocks.{l}.") that resid does not record, and what to read instead.
NOT_RECORDED = {
    "attn.hook_attn_scores": "resid records the attention probabilities (attn.hook_pattern), not the scores",
    "attn.hook_result": "per-head writes are not stored: head h writes attn.hook_z[:, :, h] @ W_O[h] "
    "(model.blocks[l].attn.W_O), and resid.analyses.attribution computes them projected",
    "hook_attn_in": "it is hook_resid_pre (resid keeps no per-head copies)",
    "hook_q_input": "it is hook_resid_pre (resid keeps no per-head copies)",
    "hook_k_input": "it is hook_resid_pre (resid keeps no per-head copies)",
    "hook_v_input": "it is hook_resid_pre (resid keeps no per-head copies)",
    "hook_mlp_in": "it is hook_resid_mid (hook_resid_pre in parallel blocks)",
}


class HookNameError(ResidError, KeyError):
    """A name this model's view does not have. A KeyError too, so that `view.get(name)` works as for a dict."""

    __str__ = ResidError.__str__  # KeyError's would print the message in quotes


class HookNames(Mapping[str, Tensor]):
    """Read-only mapping from TransformerLens hook names to the tensors of one run (see the module docstring)."""

    def __init__(self, stream: ResidualStream, model: Transformer):
        config = model.config
        self._stream = stream
        self._model = model
        self._rotary = config.positions == "rotary"
        self._gated = config.gated_mlp
        self._parallel = config.block == "parallel"
        self._pre_norms, self._post_norms = config.pre_norms, config.post_norms
        self._experts = config.n_experts > 0
        self._n_layers = config.n_layers
        self._getters: dict[str, Callable[[], Tensor]] = {"hook_embed": lambda: stream.embed}
        if not self._rotary:
            self._getters["hook_pos_embed"] = lambda: stream.pos_embed
        for layer in range(config.n_layers):
            self._getters.update(self._layer(layer))
        self._getters["ln_final.hook_scale"] = lambda: 1 / stream.final_norm_scale
        self._getters["ln_final.hook_normalized"] = lambda: model.ln_final.standardized(
            stream.final(), stream.final_norm_scale
        )

    def _layer(self, layer: int) -> dict[str, Callable[[], Tensor]]:
        stream, at, block = self._stream, f"blocks.{layer}.", self._model.blocks[layer]
        attn, mlp = stream.layers[layer].attn, stream.layers[layer].mlp
        mlp_reads = stream.resid_pre if self._parallel else stream.resid_mid
        rot = "rot_" if self._rotary else ""
        names = {
            "hook_resid_pre": lambda: stream.resid_pre(layer),
            "ln1.hook_scale": lambda: 1 / attn.norm_scale,
            "ln1.hook_normalized": lambda: block.ln_attn.standardized(stream.resid_pre(layer), attn.norm_scale),
            f"attn.hook_{rot}q": lambda: attn.q,
            f"attn.hook_{rot}k": lambda: attn.k,
            "attn.hook_v": lambda: attn.v,
            "attn.hook_pattern": lambda: attn.pattern,
            "attn.hook_z": lambda: attn.z,
            "hook_attn_out": lambda: attn.out,
            "hook_resid_mid": lambda: stream.resid_mid(layer),
            "ln2.hook_scale": lambda: 1 / mlp.norm_scale,
            "ln2.hook_normalized": lambda: block.ln_mlp.standardized(mlp_reads(layer), mlp.norm_scale),
            "mlp.hook_pre": (lambda: mlp.gate) if self._gated else (lambda: mlp.pre),
            "mlp.hook_pre_linear": lambda: mlp.pre,
            "mlp.hook_post": lambda: mlp.post,
            "hook_mlp_out": lambda: mlp.out,
            "hook_resid_post": lambda: stream.resid_post(layer),
        }
        if self._post_norms:
            names["ln1_post.hook_scale"] = lambda: 1 / attn.post_norm_scale
            names["ln2_post.hook_scale"] = lambda: 1 / mlp.post_norm_scale
        if self._experts:  # TransformerLens's Mixtral names: the router's weights; no dense pre / post
            for name in ("mlp.hook_pre", "mlp.hook_pre_linear", "mlp.hook_post"):
                names.pop(name, None)
            names["mlp.hook_expert_weights"] = lambda: mlp.expert_weights
        if not self._pre_norms:
            for name in ("ln1.hook_scale", "ln1.hook_normalized", "ln2.hook_scale", "ln2.hook_normalized"):
                del names[name]
        if self._parallel:
            del names["hook_resid_mid"]
        if not self._gated:
            del names["mlp.hook_pre_linear"]
        return {at + name: get for name, get in names.items()}

    def __getitem__(self, name: str) -> Tensor:
        get = self._getters.get(name)
        if get is None:
            raise HookNameError(self._why_missing(name))
        return get()

    def __contains__(self, name: object) -> bool:
        return name in self._getters  # without computing the value (Mapping's default would)

    def __iter__(self) -> Iterator[str]:
        return iter(self._getters)

    def __len__(self) -> int:
        return len(self._getters)

    def __repr__(self) -> str:
        return f"HookNames({len(self)} TransformerLens names over {self._n_layers} layers)"

    def _why_missing(self, name: str) -> str:
        per_layer = re.fullmatch(r"blocks\.(\d+)\.(.+)", name)
        suffix = per_layer.group(2) if per_layer else name
        if per_layer and f"blocks.0.{suffix}" in self._getters and int(per_layer.group(1)) >= self._n_layers:
            n = self._n_layers
            return f"{name!r}: layer {per_layer.group(1)} is out of range; the model has {n} layers (0..{n - 1})."
        reason = NOT_RECORDED.get(suffix) or self._not_in_this_model(suffix)
        if reason:
            return f"{name!r} is a TransformerLens name this view does not have: {reason}."
        close = difflib.get_close_matches(name, self._getters, n=5, cutoff=0.6)
        hint = f"Did you mean {', '.join(map(repr, close))}?" if close else "list(view) shows every name."
        return f"{name!r} is not a TransformerLens hook name of this model. {hint} (see docs/hook_names.md)"

    def _not_in_this_model(self, suffix: str) -> str | None:
        """Names TransformerLens has for other architectures, and what this model has instead."""
        reasons = {
            "attn.hook_q": self._rotary and "resid records queries after rotary, TransformerLens's attn.hook_rot_q",
            "attn.hook_k": self._rotary and "resid records keys after rotary, TransformerLens's attn.hook_rot_k",
            "attn.hook_rot_q": not self._rotary and "this model has no rotary embedding: use attn.hook_q",
            "attn.hook_rot_k": not self._rotary and "this model has no rotary embedding: use attn.hook_k",
            "hook_resid_mid": self._parallel and "parallel blocks have no resid_mid: both sublayers read resid_pre",
            "mlp.hook_pre_linear": not self._gated and "this MLP is not gated; mlp.hook_pre is its only input",
            "hook_pos_embed": self._rotary and "this model has rotary positions, no positional embedding write",
            "ln1.hook_scale": not self._pre_norms and "this model's sublayers read the residual without a pre-norm",
            "ln2.hook_scale": not self._pre_norms and "this model's sublayers read the residual without a pre-norm",
            "ln1_post.hook_scale": not self._post_norms and "this model has no post-norms",
            "mlp.hook_post": self._experts and "each expert has its own coefficients: read stream.layers[l].mlp.post "
            "[batch pos expert d_mlp] (and expert_weights, expert_out)",
            "mlp.hook_pre": self._experts and "each expert has its own MLP: read stream.layers[l].mlp.post, "
            "expert_weights and expert_out",
            "ln2_post.hook_scale": not self._post_norms and "this model has no post-norms",
        }
        return reasons.get(suffix) or None


def view(run: Run, model: Transformer) -> HookNames:
    """The run's stream by TransformerLens hook names, e.g. view(run, model)["blocks.3.hook_resid_pre"]."""
    return HookNames(run.stream, model)
