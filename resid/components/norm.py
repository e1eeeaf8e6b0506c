"""LayerNorm and RMSNorm that also return their scale (1/sigma or 1/rms), so it can be frozen.

With the scale s frozen, a norm is affine in its input x:

    norm(x) = s * linear(x) + b        linear(x) = g * centre(x)   (centre: minus the mean; LayerNorm only)

which is what makes direct attribution exact. The algebra of that affine map lives here and nowhere else; each
map has its adjoint beside it (map(x) . u == x . adjoint(u)), all in float32:

    map                                 adjoint                     what it is
    linear(x)          = g * centre(x)  fold(u)                     the norm without its scale and constant
    frozen(x, s)  = linear(x) * s (+ c) pull_back(u, s)             the norm with its scale frozen at s (c:
                                                                    constant(), its bias, with constants=True)
    centred(x)         = centre(x)      centred(u)                  centring alone (self-adjoint; RMSNorm: x)
    standardized(x, s) = centre(x) * s  standardized_adjoint(u, s)  the norm before its gain and bias
                                                                    (TransformerLens's hook_normalized)

so a direction u read after the norm is pull_back(u, s) before it, plus bias_dot(u) = constant() . u, which no
input carries. A frozen scale [... 1] broadcasts against the leading axes (a batch of cotangents [batch pos d]
reads one prompt's scales [pos 1]). `forward(x, scale)` is the norm itself, in the model's dtype (statistics in
float32, as Hugging Face does).
"""

import torch
from jaxtyping import Float
from torch import Tensor, nn

from resid.components import computed
from resid.config import ModelConfig


class Norm(nn.Module):
    def __init__(self, config: ModelConfig, width: int | None = None, rms: bool = False, multiplier: float = 1.0,
                 eps: float | None = None):
        """A norm of the residual (width d_model), or of `width` dims (q/k norms: always RMSNorm, rms=True).
        `multiplier`: a constant the output is multiplied by, folded into the gain (T5 v1.0's final norm).
        `eps`: another epsilon than config.norm_eps (DeepSeek's latent norms)."""
        super().__init__()
        width = config.d_model if width is None else width
        self.centre = config.norm == "layernorm" and not rms
        self.eps = config.norm_eps if eps is None else eps
        self.gain_offset = config.norm_gain_offset
        self.multiplier = multiplier
        with computed():  # the gain a checkpoint without one keeps
            self.w = nn.Parameter(torch.ones(width) - config.norm_gain_offset)
        self.b = nn.Parameter(torch.zeros(width)) if self.centre else None

    @property
    def gain(self) -> Float[Tensor, "d_model"]:
        """The effective multiplier g: w, or 1 + w for Gemma-style stored gains (times a constant multiplier)."""
        gain = self.w + self.gain_offset if self.gain_offset else self.w
        return gain * self.multiplier if self.multiplier != 1.0 else gain

    def _gain32(self) -> Float[Tensor, "d_model"]:
        # The gain in float32 before adding the offset: Gemma's 1 + w rounded to bfloat16 would lose most of w.
        gain = self.w.float() + self.gain_offset if self.gain_offset else self.w.float()
        return gain * self.multiplier if self.multiplier != 1.0 else gain

    def _gain_factor(self) -> Float[Tensor, "d_model"]:
        """What the forward multiplies a float32 product by: the stored w itself when it is the gain (a float32
        tensor times a half-precision one computes in float32 in one kernel, the same numbers as w.float() gives,
        without the copy), else _gain32()."""
        return self.w if not self.gain_offset and self.multiplier == 1.0 else self._gain32()

    @property
    def invertible(self) -> bool:
        """Whether every entry of the gain is nonzero, so that to_standardized gives back a normalized output's
        standardized input (Gemma 3 270M's pre-MLP norms have zero entries in 17 of its 18 layers)."""
        return bool((self._gain32() != 0).all())

    def centred(self, x: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch d_model"]:
        """x minus its mean over d_model for LayerNorm, x itself for RMSNorm, in float32. Centring is an orthogonal
        projection, so it is its own adjoint: centred(x) . u == x . centred(u)."""
        x32 = x.float()
        return x32 - x32.mean(-1, keepdim=True) if self.centre else x32

    def forward(
        self, x: Float[Tensor, "*batch d_model"], scale: Float[Tensor, "*batch 1"] | None = None
    ) -> tuple[Float[Tensor, "*batch d_model"], Float[Tensor, "*batch 1"]]:
        """(normalized x, the scale used). With `scale` given it is used as is (frozen) instead of being
        computed from x, in the same float32 arithmetic. A LayerNorm computing its own scale runs as torch's
        fused kernel (in float32 for half-precision x too), which returns the scale (rstd) beside the output; it
        agrees with the frozen arithmetic to float32 rounding."""
        normalized, scale = self._normalized(x, scale)
        return normalized, scale.to(x.dtype)

    def normalize(self, x: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch d_model"]:
        """The normalized x alone, where its scale is not kept (the same numbers as forward's first half, without
        casting the scale to a half-precision x's dtype)."""
        return self._normalized(x, None)[0]

    def _normalized(self, x: Tensor, scale: Tensor | None) -> tuple[Tensor, Tensor]:
        """(normalized x in x's dtype, the scale used: computed here (float32, or x's dtype from the fused
        LayerNorm), or as given where frozen)."""
        # (torch's kernel takes float32 parameters for any x, or parameters in x's dtype)
        fused = self.w.dtype in (x.dtype, torch.float32)
        if fused and scale is None and self.centre and not self.gain_offset and self.multiplier == 1:
            out, _, rstd = torch.native_layer_norm(x, (x.shape[-1],), self.w, self.b, self.eps)
            return out, rstd
        x32 = self.centred(x)
        if scale is None:
            scale = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        normalized = x32 * scale.float() * self._gain_factor()
        if self.b is not None:  # as _gain_factor: a half-precision b is added in float32 without a copy
            normalized = normalized + (self.b if self.multiplier == 1.0 else self.constant())
        return normalized.to(x.dtype), scale

    def standardized(
        self, x: Float[Tensor, "*batch d_model"], scale: Float[Tensor, "*batch 1"]
    ) -> Float[Tensor, "*batch d_model"]:
        """centre(x) * scale: the norm before its gain and bias (TransformerLens's hook_normalized), in x's dtype."""
        return (self.centred(x) * scale.float()).to(x.dtype)

    def standardized_adjoint(
        self, u: Float[Tensor, "*batch d_model"], scale: Float[Tensor, "*scale 1"]
    ) -> Float[Tensor, "*batch d_model"]:
        """The adjoint of `standardized` (float32): standardized(x, s) . u == x . standardized_adjoint(u, s)."""
        return self.centred(u) * scale.float()

    def to_standardized(self, normalized: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch d_model"]:
        """The standardized input centre(x) * scale of a normalized output, (normalized - b) / g in float32 (a gain
        with a zero entry loses what it zeroed), in the output's dtype."""
        x32 = normalized.float() - self.b.float() * self.multiplier if self.b is not None else normalized.float()
        return (x32 / self._gain32()).to(normalized.dtype)

    def from_standardized(self, standardized: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch d_model"]:
        """The normalized output of a standardized input, standardized * g + b in float32 (the inverse of
        to_standardized), in the float32 it is computed in."""
        out = standardized.float() * self._gain32()
        return out + self.b.float() * self.multiplier if self.b is not None else out

    def linear(self, x: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch d_model"]:
        """g * centre(x) in float32: the norm without its scale and bias (what a write becomes, up to s)."""
        return self.centred(x) * self._gain32()

    def frozen(
        self, x: Float[Tensor, "*batch d_model"], scale: Float[Tensor, "*scale 1"], constants: bool = True
    ) -> Float[Tensor, "*batch d_model"]:
        """The norm with its scale frozen at `scale`, in float32: linear(x) * scale, plus its bias with
        `constants` (without: the linear part, whose adjoint is pull_back)."""
        out = self.linear(x) * scale.float()
        constant = self.constant() if constants else None
        return out if constant is None else out + constant

    def constant(self) -> Float[Tensor, "d_model"] | None:
        """What the frozen norm adds whatever its input: its bias (times the multiplier), float32; None for
        RMSNorm."""
        if self.b is None:
            return None
        return self.b.float() * self.multiplier if self.multiplier != 1.0 else self.b.float()

    def fold(self, u: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch d_model"]:
        """The adjoint of `linear`, in float32: linear(x) . u == x . fold(u). Centering is self-adjoint, so
        fold(u) = centre(g * u)."""
        gained = u.float() * self._gain32()
        return gained - gained.mean(-1, keepdim=True) if self.centre else gained

    def pull_back(
        self, u: Float[Tensor, "*batch d_model"], scale: Float[Tensor, "*scale 1"]
    ) -> Float[Tensor, "*batch d_model"]:
        """fold(u) * scale: what `u` read after this norm (scale frozen) reads before it, up to bias_dot(u)."""
        return self.fold(u) * scale.float()

    def bias_dot(self, u: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch"]:
        """constant() . u (zero for RMSNorm), in float32."""
        if self.b is None:
            return torch.zeros(u.shape[:-1], device=u.device)
        return (u.float() @ self.b.float()) * self.multiplier
