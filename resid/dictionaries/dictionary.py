"""One learned dictionary: a sparse autoencoder (SAE) or a transcoder, read from any format resid loads.

Axes:

    d_in     width of the tensor the dictionary reads (its hook_in)
    d_out    width of the tensor it reconstructs (its hook_out; d_in for an SAE)
    feature  the learned features (d_sae); feature i reads with W_enc[:, i] and writes a_i * W_dec[i]

The maths, the same for every format (each reader maps its file onto these fields, see resid.dictionaries.formats):

    x'   = normalize(x) - b_dec * apply_b_dec_to_input
    pre  = x' @ W_enc + b_enc
    a    = relu(pre)                          activation "relu"     (standard SAE, Bricken et al. 2023)
           pre * (pre > threshold)            activation "jumprelu" (Rajamanoharan et al. 2024)
           relu(pre) kept at its top k        activation "topk"     (Gao et al. 2024)
           (x' @ W_enc + b_gate > 0) * relu(x' @ (W_enc * exp(r_mag)) + b_mag)    "gated" (Rajamanoharan 2024)
    x^   = denormalize(a @ W_dec + b_dec) + x @ W_skip                     (W_skip: skip transcoders)

SAELens and Gemma Scope mask relu(pre); circuit-tracer masks pre itself. relu(pre) * (pre > t) equals
pre * (pre > max(t, 0)) exactly, so the readers of the former store max(t, 0) and one definition serves both.
BatchTopK SAEs are exported as JumpReLU with one shared threshold, so they load as "jumprelu".

`normalize_activations` is SAELens's input normalization, applied as SAELens's SAE applies it at inference:
"none"; "constant_norm_rescale": x * sqrt(d_in) / |x|, the reconstruction divided by the same factor;
"layer_norm": (x - mean) / (std + 1e-5) with torch's unbiased std, the reconstruction times std plus mean.
(SAELens's "expected_average_only_in" scaling factor is folded into the weights by the reader.)

Precision (`product`, the one rule): a dictionary's matrix products run in half precision (bf16 / fp16, float32
accumulation inside the kernel) when the input and the dictionary's weights are both in that dtype on an
accelerator, whose half-precision matrix units are an order of magnitude faster than its float32 ones; otherwise in
float32. A float32 dictionary thus computes as the reference libraries compute it whatever the model's dtype, and
`dictionary.to(model.dtype)` opts into the model's precision. On the CPU (AVX-512 without AMX) a bf16 product
measured 1.6x slower than a float32 one, so there products are float32 always. What stays float32 whatever the
dtypes: the encoder products of JumpReLU, TopK and the gate of gated SAEs, which decide which features fire (a
feature flips when its pre-activation crosses the threshold or the k-th value, and a bf16 product moves it by
~2^-9 of its size: 4 to 8 flips in 6,400 decisions of a random bf16 dictionary, each a jump of a whole activation);
the biases and thresholds; the input normalization. ReLU encoders and every decoder are continuous, so their
products follow the rule. Results are returned in the input's dtype.
"""

import dataclasses
from dataclasses import dataclass
from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor, nn

from resid.dictionaries.hooks import HookPoint
from resid.errors import ResidError

Activation = Literal["relu", "jumprelu", "topk", "gated"]
Normalization = Literal["none", "constant_norm_rescale", "layer_norm"]
ACTIVATIONS = ("relu", "jumprelu", "topk", "gated")
NORMALIZATIONS = ("none", "constant_norm_rescale", "layer_norm")
LAYER_NORM_EPS = 1e-5  # SAELens's run-time layer_norm epsilon


def float32(t: Tensor) -> Tensor:
    """t in float32 (itself if it is already): what a dictionary computes besides its matrix products."""
    return t if t.dtype == torch.float32 else t.float()


def product_dtype(x: Tensor, w: Tensor) -> torch.dtype:
    """The dtype of a dictionary's product x @ w: their half precision when both have it on an accelerator, float32
    otherwise (see the module docstring)."""
    if x.dtype == w.dtype and x.dtype in (torch.bfloat16, torch.float16) and x.device.type != "cpu":
        return x.dtype
    return torch.float32


def product(x: Tensor, w: Tensor) -> Tensor:
    """x @ w in product_dtype(x, w), returned in float32."""
    dtype = product_dtype(x, w)
    return float32(x.to(dtype) @ w.to(dtype))


@dataclass(frozen=True)
class Weights:
    """The tensors every dictionary reads and writes with: pre = x' @ W_enc + b_enc, x^ = a @ W_dec + b_dec
    (+ x @ W_skip, the skip path of a skip transcoder). b_enc is None only for gated SAEs (see ActivationFunction)."""

    W_enc: Float[Tensor, "d_in feature"]
    W_dec: Float[Tensor, "feature d_out"]
    b_dec: Float[Tensor, "d_out"]
    b_enc: Float[Tensor, "feature"] | None = None
    W_skip: Float[Tensor, "d_in d_out"] | None = None


@dataclass(frozen=True)
class ActivationFunction:
    """Which features fire, and how much (see the module docstring): `kind` with what it needs, the JumpReLU
    thresholds, TopK's k, or the gated SAE's gate bias and magnitude path (b_gate, b_mag, r_mag)."""

    kind: Activation = "relu"
    threshold: Float[Tensor, "feature"] | None = None
    k: int | None = None
    b_gate: Float[Tensor, "feature"] | None = None
    b_mag: Float[Tensor, "feature"] | None = None
    r_mag: Float[Tensor, "feature"] | None = None


@dataclass(frozen=True)
class InputNormalization:
    """What is done to the input before it is encoded, and undone on the reconstruction: SAELens's
    normalize_activations (`kind`), and apply_b_dec_to_input (x' = normalize(x) - b_dec)."""

    kind: Normalization = "none"
    apply_b_dec_to_input: bool = False


@dataclass(frozen=True)
class Binding:
    """Where a dictionary reads and writes. hook_in / hook_out: the hooks as its file names them (hook_out None:
    hook_in, an SAE). point_in / point_out: those hooks as HookPoints of a model (resid Sites), set by
    resid.dictionaries.check, which also records in `checked` the model (name, config) they were checked against.
    transcoder: whether it predicts another tensor than it reads (None: when the hooks differ, it has a skip path
    or the widths differ)."""

    hook_in: str | None = None
    hook_out: str | None = None
    point_in: HookPoint | None = None
    point_out: HookPoint | None = None
    transcoder: bool | None = None
    checked: tuple | None = None  # (model name, ModelConfig) of the check that set the points


_FLAT = {"weights": ("W_enc", "W_dec", "b_dec", "b_enc", "W_skip"),
         "activation": ("threshold", "k", "b_gate", "b_mag", "r_mag"),
         "normalization": ("normalize_activations", "apply_b_dec_to_input"),
         "binding": ("hook_in", "hook_out", "point_in", "point_out", "transcoder")}


def _grouped(activation: ActivationFunction | str, flat: dict, normalization: InputNormalization,
             binding: Binding) -> tuple[Weights, ActivationFunction, InputNormalization, Binding]:
    """The four values from the separate keywords Dictionary took before it took them (W_enc=..., activation="relu",
    hook_in=...), with a DeprecationWarning: those calls keep working for one release."""
    import warnings

    unknown = sorted(set(flat) - {field for fields in _FLAT.values() for field in fields})
    if unknown:
        raise TypeError(f"Dictionary() got unexpected keyword arguments {unknown}")
    missing = [field for field in ("W_enc", "W_dec", "b_dec") if field not in flat]
    if missing:
        raise ResidError(f"Dictionary needs its weights: pass Weights(W_enc, W_dec, b_dec, ...) (or the keywords "
                         f"{', '.join(missing)}).")
    warnings.warn("Dictionary(W_enc=..., activation=..., hook_in=..., ...) is deprecated and will be removed in the "
                  "next release: pass Dictionary(Weights(W_enc, W_dec, b_dec, b_enc), ActivationFunction(kind, "
                  "threshold=..., k=...), normalization=InputNormalization(...), binding=Binding(hook_in, hook_out)).",
                  DeprecationWarning, stacklevel=3)
    kind = activation if isinstance(activation, str) else activation.kind
    pick = lambda group: {f: flat[f] for f in _FLAT[group] if f in flat}  # noqa: E731
    normal = pick("normalization")
    return (Weights(**pick("weights")), ActivationFunction(kind, **pick("activation")),
            InputNormalization(normal.get("normalize_activations", normalization.kind),
                               normal.get("apply_b_dec_to_input", normalization.apply_b_dec_to_input)),
            dataclasses.replace(binding, **pick("binding")))


def shared(value: Tensor | None) -> Tensor | None:
    """`value`'s storage as a plain tensor (None for None), which a constructor wraps in a new Parameter: a
    dictionary made from another one (a checked dictionary, resid.dictionaries.check) shares its weights, never
    copies them, and moving or replacing its Parameters leaves the other's alone."""
    return None if value is None else value.detach()


class Dictionary(nn.Module):
    """A sparse autoencoder (hook_out == hook_in) or transcoder (it reads hook_in and predicts hook_out).

    Build one with a format reader or `resid.dictionaries.load`; the constructor checks every shape. The four
    values it is made of (Weights, ActivationFunction, InputNormalization, Binding) are kept as the module's flat
    fields (W_enc, threshold, k, normalize_activations, hook_in, point_in, ...), which every reader reads;
    `activation` is the ActivationFunction's kind."""

    def __init__(
        self,
        weights: Weights | None = None,
        activation: ActivationFunction | Activation = ActivationFunction(),
        *,
        normalization: InputNormalization = InputNormalization(),
        binding: Binding = Binding(),
        name: str = "dictionary",
        format: str = "custom",
        model_name: str | None = None,
        metadata: dict | None = None,
        **flat: object,
    ):
        if weights is None or isinstance(activation, str) or flat:  # the separate keywords of resid <= 0.x
            weights, activation, normalization, binding = _grouped(activation, flat, normalization, binding)
        super().__init__()
        d_in, d_sae = weights.W_enc.shape
        d_out = weights.W_dec.shape[-1]
        self.d_in, self.d_out, self.d_sae = int(d_in), int(d_out), int(d_sae)
        self.activation = activation.kind
        self.k = activation.k
        self.apply_b_dec_to_input = normalization.apply_b_dec_to_input
        self.normalize_activations = normalization.kind
        self.name, self.format = name, format  # what was loaded, and the format it was read as
        self.binding = dataclasses.replace(binding, hook_out=binding.hook_out if binding.hook_out is not None
                                           else binding.hook_in)
        self.model_name = model_name  # the model the file says it was trained on (None if it does not say)
        self.metadata = dict(metadata or {})  # what else the file records (provenance, training settings)
        for field in ("W_enc", "W_dec", "b_dec", "b_enc", "W_skip"):
            value = getattr(weights, field)
            setattr(self, field, nn.Parameter(value) if value is not None else None)
        for field in ("threshold", "b_gate", "b_mag", "r_mag"):
            value = getattr(activation, field)
            setattr(self, field, nn.Parameter(value) if value is not None else None)
        self._validate()

    @property
    def weights(self) -> Weights:
        return Weights(self.W_enc, self.W_dec, self.b_dec, self.b_enc, self.W_skip)

    @property
    def activation_function(self) -> ActivationFunction:
        return ActivationFunction(self.activation, self.threshold, self.k, self.b_gate, self.b_mag, self.r_mag)

    @property
    def normalization(self) -> InputNormalization:
        return InputNormalization(self.normalize_activations, self.apply_b_dec_to_input)

    def bound(self, binding: Binding) -> "Dictionary":
        """A new Dictionary with `binding`, sharing this one's weights (see `shared`); this one is unchanged."""
        weights = Weights(*(shared(w) for w in (self.W_enc, self.W_dec, self.b_dec, self.b_enc, self.W_skip)))
        function = self.activation_function
        activation = dataclasses.replace(function, **{f: shared(getattr(function, f)) for f in
                                                      ("threshold", "b_gate", "b_mag", "r_mag")})
        return Dictionary(weights, activation, normalization=self.normalization, binding=binding, name=self.name,
                          format=self.format, model_name=self.model_name, metadata=self.metadata)

    @property
    def hook_in(self) -> str | None:
        return self.binding.hook_in

    @property
    def hook_out(self) -> str | None:
        return self.binding.hook_out

    @property
    def point_in(self) -> HookPoint | None:
        """The hook it reads mapped onto a resid Site (None until checked against a model)."""
        return self.binding.point_in

    @property
    def point_out(self) -> HookPoint | None:
        return self.binding.point_out

    def _validate(self) -> None:
        where = f"Dictionary {self.name!r}"
        problems = []
        expected = {"W_dec": (self.d_sae, self.d_out), "b_dec": (self.d_out,), "b_enc": (self.d_sae,),
                    "threshold": (self.d_sae,), "b_gate": (self.d_sae,), "b_mag": (self.d_sae,),
                    "r_mag": (self.d_sae,), "W_skip": (self.d_in, self.d_out)}
        for field, shape in expected.items():
            value = getattr(self, field)
            if value is not None and tuple(value.shape) != shape:
                problems.append(f"{field} has shape {list(value.shape)}, expected {list(shape)} from W_enc "
                                f"[d_in={self.d_in}, feature={self.d_sae}] and W_dec's d_out={self.d_out}")
        if self.activation not in ACTIVATIONS:
            problems.append(f"activation {self.activation!r} is not one of {', '.join(ACTIVATIONS)}")
        needs = {"relu": ("b_enc",), "jumprelu": ("b_enc", "threshold"), "topk": ("b_enc",),
                 "gated": ("b_gate", "b_mag", "r_mag")}.get(self.activation, ())
        problems += [f"activation {self.activation!r} needs {field}" for field in needs if getattr(self, field) is None]
        if self.activation == "topk" and not (isinstance(self.k, int) and 0 < self.k <= self.d_sae):
            problems.append(f"topk needs an integer k in 1..{self.d_sae}, got k={self.k!r}")
        if self.normalize_activations not in NORMALIZATIONS:
            problems.append(f"normalize_activations {self.normalize_activations!r} is not one of "
                            f"{', '.join(NORMALIZATIONS)}")
        if self.apply_b_dec_to_input and self.d_out != self.d_in:
            problems.append("apply_b_dec_to_input subtracts b_dec from the input, so it needs d_out == d_in")
        if self.normalize_activations != "none" and self.is_transcoder:
            problems.append(f"normalize_activations={self.normalize_activations!r} on a transcoder: the output is "
                            "another tensor, which the input's normalization cannot be undone on")
        if problems:
            raise ResidError(f"{where} is malformed: " + "; ".join(problems) + ". The file is corrupt or written "
                             "by a library version resid does not read.")

    @property
    def is_transcoder(self) -> bool:
        """It predicts another tensor than the one it reads."""
        if self.binding.transcoder is not None:
            return self.binding.transcoder
        return self.hook_out != self.hook_in or self.W_skip is not None or self.d_out != self.d_in

    @property
    def site_in(self):
        """The resid Site of the tensor the dictionary reads (None until checked against a model; see point_in)."""
        return None if self.point_in is None else self.point_in.site

    @property
    def site_out(self):
        """The resid Site of the tensor it reconstructs (see point_out)."""
        return None if self.point_out is None else self.point_out.site

    def __repr__(self) -> str:
        hooks = self.hook_in if not self.is_transcoder else f"{self.hook_in} -> {self.hook_out}"
        return (f"Dictionary({self.name!r}, {self.format}, {self.activation}, d_in={self.d_in}, d_sae={self.d_sae}, "
                f"d_out={self.d_out}, {hooks})")

    # --- the maths -------------------------------------------------------------------------------------------
    def _normalize(self, x: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """x as the encoder reads it, and what undoes the normalization on the output: (coefficient, None) for
        constant_norm_rescale (divide by it), (std, mean) for layer_norm (times std plus mean)."""
        if self.normalize_activations == "constant_norm_rescale":
            x = float32(x)
            coefficient = (self.d_in ** 0.5) / x.norm(dim=-1, keepdim=True)
            return x * coefficient, coefficient, None
        if self.normalize_activations == "layer_norm":
            x = float32(x)
            mean = x.mean(dim=-1, keepdim=True)
            centred = x - mean
            std = centred.std(dim=-1, keepdim=True)
            return centred / (std + LAYER_NORM_EPS), std, mean
        return x, None, None

    def _encoder_input(self, x: Tensor) -> Tensor:
        """x' = normalize(x) - b_dec * apply_b_dec_to_input, in float32 when either applies (x itself, in its dtype,
        otherwise: product_dtype reads it)."""
        x = self._normalize(x)[0]
        return x - float32(self.b_dec) if self.apply_b_dec_to_input else x

    def pre_activations(self, x: Float[Tensor, "*batch d_in"]) -> Float[Tensor, "*batch feature"]:
        """x' @ W_enc + b_enc in float32 (for gated SAEs the magnitude path's pre-activation)."""
        return self._pre_activations(self._encoder_input(x))

    def _pre_activations(self, x: Tensor) -> Tensor:
        x = x if self.activation == "relu" else float32(x)  # which features fire is decided in float32
        if self.activation == "gated":
            return product(x, float32(self.W_enc) * float32(self.r_mag).exp()) + float32(self.b_mag)
        return product(x, self.W_enc) + float32(self.b_enc)

    def encode(self, x: Float[Tensor, "*batch d_in"]) -> Float[Tensor, "*batch feature"]:
        """Feature activations a (dense, mostly zero), in x's dtype."""
        encoder_input = self._encoder_input(x)
        pre = self._pre_activations(encoder_input)
        if self.activation == "relu":
            acts = torch.relu(pre)
        elif self.activation == "jumprelu":
            acts = pre * (pre > float32(self.threshold))
        elif self.activation == "topk":
            values, indices = torch.topk(pre, k=self.k, dim=-1, sorted=False)
            acts = torch.zeros_like(pre).scatter_(-1, indices, values.relu())
        else:  # gated: the gate path decides which features fire, the magnitude path how much
            gate = (product(encoder_input, self.W_enc) + float32(self.b_gate)) > 0
            acts = gate * torch.relu(pre)
        return acts.to(x.dtype)

    def decode(
        self, acts: Float[Tensor, "*batch feature"], x: Float[Tensor, "*batch d_in"] | None = None
    ) -> Float[Tensor, "*batch d_out"]:
        """The reconstruction a @ W_dec + b_dec (+ x @ W_skip), in acts' dtype. `x`, the input that was encoded,
        is needed when the dictionary has a skip path or a run-time input normalization (whose scale the
        reconstruction undoes); otherwise it is ignored."""
        if x is None and (self.W_skip is not None or self.normalize_activations != "none"):
            need = "a skip path (W_skip)" if self.W_skip is not None else \
                f"normalize_activations={self.normalize_activations!r}"
            raise ResidError(f"Dictionary {self.name!r} has {need}, so decode needs the input too: "
                             "dictionary.decode(acts, x).")
        out = product(acts, self.W_dec) + float32(self.b_dec)
        if self.normalize_activations != "none":
            _, scale, shift = self._normalize(x)
            out = out / scale if shift is None else out * scale + shift
        if self.W_skip is not None:
            out = out + product(x, self.W_skip)
        return out.to(acts.dtype)

    def forward(
        self, x: Float[Tensor, "*batch d_in"]
    ) -> tuple[Float[Tensor, "*batch feature"], Float[Tensor, "*batch d_out"]]:
        """(feature activations, reconstruction) of x."""
        acts = self.encode(x)
        return acts, self.decode(acts, x)
