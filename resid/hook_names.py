"""TransformerLens hook names as a read-only view of one run's typed stream: the bridge for TL users.

    names = resid.hook_names.view(run, model)
    names["blocks.3.hook_resid_pre"]        # run.stream.resid_pre(3)
    names["blocks.3.attn.hook_z"]           # run.stream.layers[3].attn.z
    list(names)                             # every name this model has, in forward order

The typed stream stays the primary interface; this view only renames it, from the one table of TransformerLens
names (resid.sites.transformerlens). Values are computed when read
(resid_pre/mid/post are sums of writes), and a name whose field was not captured raises the stream's own error,
which names the Capture option to set. The mapping, with where resid's fields differ, is docs/hook_names.md.

Where TransformerLens's conventions differ from resid's field names, the view follows TransformerLens:
- `ln*.hook_scale` is sigma (or rms), the reciprocal of resid's `norm_scale` (1/sigma).
- `ln*.hook_normalized` is (x - mean) / sigma (x / rms for RMSNorm) before the gain and bias; resid's
  `normalized` is after them (what the sublayer reads).
- gated MLPs: `mlp.hook_pre` is the gate's input (resid's `gate`), `mlp.hook_pre_linear` the up branch
  (resid's `pre`).
- `attn.hook_q` / `hook_k` are the projections before any q/k norm and rotary, resid's `q_proj` / `k_proj`;
  resid's `q` / `k` are what the scores read, TL's `attn.hook_rot_q` / `hook_rot_k` in rotary models (in
  models with neither q/k norm nor rotary `q_proj` is `q`, one tensor).
- `attn.hook_attn_scores` is resid's `scores`: -inf at masked keys, as in TL, except that a padding query
  reads itself (resid's padding rule), so its row is finite there.
- mixtures of experts (Mixtral): `mlp.hook_expert_weights` is the router's renormalized weights; the dense
  `mlp.hook_pre` / `hook_post` do not exist (each expert's are in `stream.layers[l].mlp`).
- post-norms (Gemma 2/3): `ln1_post.hook_scale` / `ln2_post.hook_scale` are the post-norms' sigma; models
  without pre-norms (OLMo 2) have no `ln1` / `ln2` names.
"""

import difflib
from collections.abc import Callable, Iterator, Mapping

from torch import Tensor

from resid.errors import ResidError
from resid.model import Run, Transformer
from resid.sites import Site, transformerlens
from resid.sites.transformerlens import BLOCK, Name, at_layer
from resid.stream import ResidualStream


class HookNameError(ResidError, KeyError):
    """A name this model's view does not have. A KeyError too, so that `view.get(name)` works as for a dict."""

    __str__ = ResidError.__str__  # KeyError's would print the message in quotes


class HookNames(Mapping[str, Tensor]):
    """Read-only mapping from TransformerLens hook names to the tensors of one run (see the module docstring):
    the view rows of resid.sites.transformerlens.TABLE this model has."""

    def __init__(self, stream: ResidualStream, model: Transformer):
        self._stream = stream
        self._model = model
        self._n_layers = model.config.n_layers
        self._getters: dict[str, Callable[[], Tensor]] = {}
        rows = transformerlens.of_model(model.config)
        for row in (r for r in rows if not r.layered and r.part is not None):  # the embeddings
            self._getters[row.name] = self._getter(row, None)
        for layer in range(self._n_layers):
            for row in (r for r in rows if r.layered):
                self._getters[row.full(layer)] = self._getter(row, layer)
        for row in (r for r in rows if not r.layered and r.part is None):  # the final norm's
            self._getters[row.name] = self._final(row)

    def _getter(self, row: Name, layer: int | None) -> Callable[[], Tensor]:
        """The tensor of a row with a Site: the record, its reciprocal, or the norm's standardized input."""
        stream, site = self._stream, Site(layer, row.part, field=row.field)
        if row.reads == "reciprocal":
            return lambda: 1 / stream.read(site)
        if row.reads == "standardized":
            block = self._model.blocks[layer]
            norm = block.ln_attn if row.part == "attn" else block.ln_mlp
            scale = Site(layer, row.part, field="norm_scale")
            reads = block.reads(row.part)
            return lambda: norm.standardized(stream.read(reads), stream.read(scale))
        return lambda: stream.read(site)

    def _final(self, row: Name) -> Callable[[], Tensor]:
        """The final norm's names, which have no Site: its sigma, and its standardized input."""
        stream, norm = self._stream, self._model.ln_final
        if row.reads == "reciprocal":
            return lambda: 1 / stream.final_norm_scale
        return lambda: norm.standardized(stream.final(), stream.final_norm_scale)

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
        per_layer = BLOCK.fullmatch(name)
        suffix = per_layer.group(2) if per_layer else name
        if per_layer and at_layer(0, suffix) in self._getters and int(per_layer.group(1)) >= self._n_layers:
            n = self._n_layers
            return f"{name!r}: layer {per_layer.group(1)} is out of range; the model has {n} layers (0..{n - 1})."
        _, rows = transformerlens.rows(name)
        reason = next((row.note for row in rows if row.note), "")
        if reason:
            return f"{name!r} is a TransformerLens name this view does not have: {reason}."
        close = difflib.get_close_matches(name, self._getters, n=5, cutoff=0.6)
        hint = f"Did you mean {', '.join(map(repr, close))}?" if close else "list(view) shows every name."
        return f"{name!r} is not a TransformerLens hook name of this model. {hint} (see docs/hook_names.md)"


def view(run: Run, model: Transformer) -> HookNames:
    """The run's stream by TransformerLens hook names, e.g. view(run, model)["blocks.3.hook_resid_pre"]."""
    return HookNames(run.stream, model)
