"""A cross-layer transcoder (CLT; Ameisen et al. 2025, circuit-tracer): a feature of layer l reads that layer's
MLP input and writes into the MLP output of layer l and of every later layer.

Axes: `layer` the model's layers (source or target), `feature` the features of one source layer (d_sae each),
`target` the layers a source layer's features write to (l .. n_layers - 1), `d_in` / `d_out` as for a Dictionary.

    a[l]    = act(x[l] @ W_enc[l] + b_enc[l])                   act: relu, or pre * (pre > threshold[l])
    x^[t]   = sum over l <= t of a[l] @ W_dec[l][:, t - l] + b_dec[t]   (+ x[t] @ W_skip[t])

Computed as resid.dictionaries.Dictionary computes (its `product` rule: products in half precision where the input
and the weights are both half precision on an accelerator, float32 otherwise; JumpReLU encoders, thresholds and
biases in float32) and returned in the input's dtype.
"""

from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor, nn

from resid.dictionaries.dictionary import float32, product, shared
from resid.dictionaries.encoded import LayerRecord
from resid.dictionaries.hooks import HookPoint
from resid.errors import ResidError


class CrossLayerTranscoder(nn.Module):
    """One CLT over all layers; `W_dec[l]` is source layer l's decoder [feature target d_out], target t - l."""

    def __init__(
        self,
        *,
        W_enc: Float[Tensor, "layer d_in feature"],
        b_enc: Float[Tensor, "layer feature"],
        W_dec: list[Float[Tensor, "feature target d_out"]],
        b_dec: Float[Tensor, "layer d_out"],
        activation: Literal["relu", "jumprelu"],
        threshold: Float[Tensor, "layer feature"] | None = None,
        W_skip: Float[Tensor, "layer d_in d_out"] | None = None,
        name: str = "clt",
        format: str = "custom",
        hook_in: str | None = None,
        hook_out: str | None = None,
        model_name: str | None = None,
        metadata: dict | None = None,
    ):
        super().__init__()
        n_layers, d_in, d_sae = W_enc.shape
        self.n_layers, self.d_in, self.d_sae, self.d_out = int(n_layers), int(d_in), int(d_sae), int(b_dec.shape[-1])
        self.activation = activation
        self.name, self.format = name, format
        self.hook_in, self.hook_out = hook_in, hook_out  # per layer, as the file says (e.g. "hook_resid_mid")
        self.model_name = model_name
        self.metadata = dict(metadata or {})
        # per layer, set by resid.dictionaries.check (see `bound`), with the model (name, config) they were checked
        # against
        self.points_in: tuple[HookPoint, ...] | None = None
        self.points_out: tuple[HookPoint, ...] | None = None
        self.checked: tuple | None = None
        self.W_enc, self.b_enc, self.b_dec = nn.Parameter(W_enc), nn.Parameter(b_enc), nn.Parameter(b_dec)
        self.W_dec = nn.ParameterList([nn.Parameter(w) for w in W_dec])
        self.threshold = nn.Parameter(threshold) if threshold is not None else None
        self.W_skip = nn.Parameter(W_skip) if W_skip is not None else None
        self._validate()

    def _validate(self) -> None:
        n, problems = self.n_layers, []
        shapes = {"b_enc": (n, self.d_sae), "b_dec": (n, self.d_out), "threshold": (n, self.d_sae),
                  "W_skip": (n, self.d_in, self.d_out)}
        for field, shape in shapes.items():
            value = getattr(self, field)
            if value is not None and tuple(value.shape) != shape:
                problems.append(f"{field} has shape {list(value.shape)}, expected {list(shape)}")
        if len(self.W_dec) != n:
            problems.append(f"W_dec has {len(self.W_dec)} source layers, W_enc {n}")
        for source, w in enumerate(self.W_dec):
            if tuple(w.shape) != (self.d_sae, n - source, self.d_out):
                problems.append(f"W_dec[{source}] has shape {list(w.shape)}, expected "
                                f"{[self.d_sae, n - source, self.d_out]} (targets {source}..{n - 1})")
        if self.activation not in ("relu", "jumprelu"):
            problems.append(f"activation {self.activation!r} is not 'relu' or 'jumprelu'")
        if self.activation == "jumprelu" and self.threshold is None:
            problems.append("activation 'jumprelu' needs threshold")
        if problems:
            raise ResidError(f"Cross-layer transcoder {self.name!r} is malformed: " + "; ".join(problems) + ".")

    def bound(self, points_in: tuple[HookPoint, ...], points_out: tuple[HookPoint, ...],
              checked: tuple) -> "CrossLayerTranscoder":
        """A new CLT whose hooks are `points_in` / `points_out` of the model `checked` names, sharing this one's
        weights (resid.dictionaries.dictionary.shared); this one is unchanged."""
        clt = CrossLayerTranscoder(
            W_enc=shared(self.W_enc), b_enc=shared(self.b_enc), W_dec=[shared(w) for w in self.W_dec],
            b_dec=shared(self.b_dec), activation=self.activation, threshold=shared(self.threshold),
            W_skip=shared(self.W_skip), name=self.name, format=self.format, hook_in=self.hook_in,
            hook_out=self.hook_out, model_name=self.model_name, metadata=self.metadata)
        clt.points_in, clt.points_out, clt.checked = tuple(points_in), tuple(points_out), checked
        return clt

    def __repr__(self) -> str:
        return (f"CrossLayerTranscoder({self.name!r}, {self.format}, {self.activation}, n_layers={self.n_layers}, "
                f"d_in={self.d_in}, d_sae={self.d_sae}, {self.hook_in} -> {self.hook_out})")

    def encode_layer(self, layer: int, x: Float[Tensor, "*batch d_in"]) -> Float[Tensor, "*batch feature"]:
        """Source layer `layer`'s feature activations, in x's dtype."""
        # a JumpReLU decides which features fire in float32 (resid.dictionaries.dictionary's precision rule)
        pre = product(x if self.activation == "relu" else float32(x), self.W_enc[layer]) + float32(self.b_enc[layer])
        if self.activation == "relu":
            return torch.relu(pre).to(x.dtype)
        return (pre * (pre > float32(self.threshold[layer]))).to(x.dtype)

    def encode(self, x: Float[Tensor, "layer *batch d_in"]) -> Float[Tensor, "layer *batch feature"]:
        """Every layer's features from every layer's input (x[l]: layer l's MLP input)."""
        self._check_layers(x, "x")
        return torch.stack([self.encode_layer(layer, x[layer]) for layer in range(self.n_layers)])

    def decode_layer(
        self, target: int, acts: Float[Tensor, "source *batch feature"], x: Float[Tensor, "*batch d_in"] | None = None
    ) -> Float[Tensor, "*batch d_out"]:
        """The reconstruction of layer `target`'s MLP output from the features of layers 0..target (acts may hold
        more layers; only those are read); `x` is layer target's input, needed with a skip path."""
        if acts.shape[0] <= target:
            raise ResidError(f"decode_layer({target}) needs the activations of layers 0..{target}; got "
                             f"{acts.shape[0]} layers.")
        out = float32(self.b_dec[target])
        for source in range(target + 1):
            out = out + product(acts[source], self.W_dec[source][:, target - source])
        if self.W_skip is not None:
            if x is None:
                raise ResidError(f"Cross-layer transcoder {self.name!r} has a skip path (W_skip), so decoding needs "
                                 "the input too: clt.decode_layer(target, acts, x).")
            out = out + product(x, self.W_skip[target])
        return out.to(acts.dtype)

    def decode(
        self, acts: Float[Tensor, "layer *batch feature"], x: Float[Tensor, "layer *batch d_in"] | None = None
    ) -> Float[Tensor, "layer *batch d_out"]:
        """Every layer's reconstructed MLP output."""
        self._check_layers(acts, "acts")
        return torch.stack([self.decode_layer(t, acts, None if x is None else x[t]) for t in range(self.n_layers)])

    def forward(
        self, x: Float[Tensor, "layer *batch d_in"]
    ) -> tuple[Float[Tensor, "layer *batch feature"], Float[Tensor, "layer *batch d_out"]]:
        acts = self.encode(x)
        return acts, self.decode(acts, x)

    # --- the transcoder protocol (resid.dictionaries.transcoders.MLPTranscoders) --------------------------------
    @property
    def dictionaries(self) -> tuple["CrossLayerTranscoder"]:
        return (self,)

    def encoder(self, layer: int) -> Float[Tensor, "d_in feature"]:
        return self.W_enc[layer]

    def pre_activations(self, layer: int, x: Float[Tensor, "*batch d_in"]) -> Float[Tensor, "*batch feature"]:
        """Source layer `layer`'s pre-activations x @ W_enc[layer] + b_enc[layer], in float32."""
        return product(float32(x), float32(self.W_enc[layer])) + float32(self.b_enc[layer])

    def decoder(self, source: int, target: int) -> Float[Tensor, "feature d_out"]:
        return self.W_dec[source][:, target - source]

    def targets(self, source: int) -> range:
        return range(source, self.n_layers)

    def decoder_bias(self, target: int) -> Float[Tensor, "d_out"]:
        return self.b_dec[target]

    def skip(self, target: int) -> Float[Tensor, "d_in d_out"] | None:
        return None if self.W_skip is None else self.W_skip[target]

    def layer_record(self, run, layer: int) -> LayerRecord:
        """Layer `layer`'s record in `run`."""
        found = run.dictionaries[self.name]
        return LayerRecord(found.layer_acts(layer), found.reconstruction[layer], found.error[layer],
                           found.input[layer])

    def _check_layers(self, tensor: Tensor, what: str) -> None:
        if tensor.shape[0] != self.n_layers:
            raise ResidError(f"Cross-layer transcoder {self.name!r} spans {self.n_layers} layers; {what} has "
                             f"{tensor.shape[0]} on its first axis (one per layer).")
