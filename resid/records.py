"""The records of one run's sublayers: what each attention and MLP sublayer computed, as typed attributes.

Each record keeps only what its Capture asked for; reading anything else raises a ResidError that names the
Capture option to set, or says why this model has no such tensor. A field may be given on read (`OnRead`): an
attention's scores and pattern, [batch head pos key_pos], are formed from the queries and keys the run kept when
first read, so a capture holds what grows linearly with the prompt until a pattern is read.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from jaxtyping import Float
from torch import Tensor

from resid.config import ModelConfig
from resid.errors import ResidError


class OnRead:
    """A field formed on its first read by `form` and kept: every later read gives the same tensor. `shape` is
    the shape it will have (a record's repr shows it without forming it)."""

    def __init__(self, form: Callable[[], Tensor], shape: tuple[int, ...]):
        self._form: Callable[[], Tensor] | None = form
        self.shape = tuple(shape)
        self._value: Tensor | None = None

    @property
    def formed(self) -> bool:
        return self._value is not None

    @property
    def value(self) -> Tensor:
        if self._value is None:
            self._value = self._form()
            self._form = None  # what it was formed from is no longer held here
        return self._value


class _Record:
    """Captured tensors of one sublayer (some given on read, OnRead); missing ones raise an error saying how to
    capture them."""

    _part = ""

    def __init__(self, layer: int, values: dict[str, Tensor | OnRead], absent: dict[str, str] | None = None,
                 same: dict[str, str] | None = None):
        self.layer = layer
        self._values = values
        self._absent = absent or {}  # field -> why the model has no such tensor (e.g. not a gated MLP)
        self._same = same or {}  # field -> the field it is in this model, kept once (same_fields)

    def _get(self, name: str) -> Tensor:
        value = self._values.get(self._same.get(name, name))
        if isinstance(value, OnRead):
            return value.value
        if value is not None:
            return value
        if name in self._absent:
            raise ResidError(f"stream.layers[{self.layer}].{self._part}.{name} does not exist: {self._absent[name]}.")
        raise ResidError(
            f"stream.layers[{self.layer}].{self._part}.{name} was not captured. Run with "
            f"resid.Capture({self._part}={{'{name}', ...}}) (and layer {self.layer} in Capture.layers), "
            "or resid.Capture.all()."
        )

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}{list(v.shape)}" for k, v in self._values.items() if v is not None)
        return f"{type(self).__name__}(layer={self.layer}, {fields})"


    @property
    def normalized(self) -> Float[Tensor, "batch pos d_model"]:
        """The sublayer's input after its norm (gain and bias applied). Attention reads resid_pre; the MLP
        reads resid_mid (resid_pre in parallel blocks)."""
        return self._get("normalized")

    @property
    def norm_scale(self) -> Float[Tensor, "batch pos 1"]:
        """The sublayer norm's 1/sigma (LayerNorm) or 1/rms (RMSNorm) of the residual it reads."""
        return self._get("norm_scale")

    @property
    def resid_norm_scale(self) -> Float[Tensor, "batch pos 1"]:
        """Post-LN models (BERT, the original Transformer): the scale of the norm of the residual after this
        sublayer's write is added, resid_mid = ln(resid_pre + attn.out) (resid_post for the MLP). Always kept."""
        return self._get("resid_norm_scale")

    @property
    def post_norm_scale(self) -> Float[Tensor, "batch pos 1"]:
        """Models with post-norms (Gemma 2/3, OLMo 2): the scale of the norm applied to the sublayer's output
        before it is written. Frozen, it makes the write linear in the output (per-head, per-neuron writes)."""
        return self._get("post_norm_scale")


class AttnRecord(_Record):
    _part = "attn"

    @property
    def q_proj(self) -> Float[Tensor, "batch pos head d_head"]:
        """Queries as projected, normalized @ W_Q + b_Q, before any q/k norm and the rotary embedding
        (TransformerLens's attn.hook_q). In models with neither, the same tensor as `q` (kept once)."""
        return self._get("q_proj")

    @property
    def k_proj(self) -> Float[Tensor, "batch pos kv_head d_head"]:
        """Keys as projected, before any q/k norm and rotary (TransformerLens's attn.hook_k); `k` in models with
        neither."""
        return self._get("k_proj")

    @property
    def q(self) -> Float[Tensor, "batch pos head d_head"]:
        """Queries as used in the scores (after the q norm and the rotary embedding, if any)."""
        return self._get("q")

    @property
    def k(self) -> Float[Tensor, "batch pos kv_head d_head"]:
        """Keys as used in the scores (after the k norm and rotary); kv_head < head under grouped-query attention."""
        return self._get("k")

    @property
    def v(self) -> Float[Tensor, "batch pos kv_head d_head"]:
        return self._get("v")

    @property
    def kv_latent(self) -> Float[Tensor, "batch pos kv_rank"]:
        """Latent attention (DeepSeek V2/V3) only: the compressed latent every head's keys (their no-rope dims)
        and values are read from, normalized @ W_DKV through its RMSNorm (what DeepSeek caches, beside the
        shared rotary key)."""
        return self._get("kv_latent")

    @property
    def kv_norm_scale(self) -> Float[Tensor, "batch pos 1"]:
        """Latent attention only: the scale (1/rms) of the latent's RMSNorm; frozen, the values are linear in
        what the attention reads."""
        return self._get("kv_norm_scale")

    @property
    def scores(self) -> Float[Tensor, "batch head pos key_pos"]:
        """The softmax's input: q k^T * scale, soft-capped (Gemma 2), plus the relative position bias (T5), -inf
        at the keys a query may not read (later positions, padding, outside a sliding window); a padding query
        reads itself, so its row is finite there (TransformerLens's attn.hook_attn_scores). Formed from the run's
        q and k on the first read (the same tensor afterwards), except where the forward formed it itself (soft
        caps, edited scores or pattern): then it is that one, edits included. With Capture(positions=...), pos is
        the captured query positions and key_pos every position."""
        return self._get("scores")

    @property
    def pattern(self) -> Float[Tensor, "batch head pos key_pos"]:
        """Attention probabilities: softmax(scores) over key_pos in float32, in the model dtype (each row sums to
        1). Given on read like `scores`; an edited pattern is the one the forward used."""
        return self._get("pattern")

    @property
    def z(self) -> Float[Tensor, "batch pos head d_head"]:
        """Per-head mix of values; head h writes z[..., h, :] @ W_O[h]."""
        return self._get("z")

    @property
    def out(self) -> Float[Tensor, "batch pos d_model"]:
        """The sublayer's write into the residual stream (sum over heads of z @ W_O, plus b_O; through the
        post-norm in models that have one)."""
        return self._get("out")


class MLPRecord(_Record):
    """A dense MLP's record, or a mixture of experts' (Mixtral, resid.components.moe): `post` then has an
    expert axis, and router_logits, expert_weights and expert_out exist (pre and gate do not)."""

    _part = "mlp"

    @property
    def pre(self) -> Float[Tensor, "batch pos d_mlp"]:
        """Key scores: normalized @ W_in + b_in. For gated MLPs this is the linear 'up' branch, which the gate
        multiplies; TransformerLens's hook_pre is the gate's input instead (resid's `gate`)."""
        return self._get("pre")

    @property
    def gate(self) -> Float[Tensor, "batch pos d_mlp"]:
        """Gated MLPs only: normalized @ W_gate + b_gate, before the activation."""
        return self._get("gate")

    @property
    def post(self) -> Float[Tensor, "batch pos d_mlp"] | Float[Tensor, "batch pos expert d_mlp"]:
        """Memory coefficients m_i: act(pre), or act(gate) * pre; neuron i writes post[i] * W_out[i]. Mixture
        of experts: [batch pos expert d_mlp], each expert's act(x W_gate[e]) * (x W_in[e]), zero for experts
        the token was not routed to; neuron i of expert e writes expert_weights[e] * post[e, i] * W_out[e, i]."""
        return self._get("post")

    @property
    def router_logits(self) -> Float[Tensor, "batch pos routed"]:
        """Mixture of experts only: normalized @ W_router, before the softmax (or sigmoid) over the routed experts
        (the shared experts, DeepSeek's last n_shared_experts, are not routed)."""
        return self._get("router_logits")

    @property
    def expert_weights(self) -> Float[Tensor, "batch pos expert"]:
        """Mixture of experts only: the top-k router scores, renormalized to sum to 1 where the model does and
        scaled by its router_scale, zero for the experts the token was not routed to, one for shared experts (in
        the model dtype)."""
        return self._get("expert_weights")

    @property
    def expert_out(self) -> Float[Tensor, "batch pos expert d_model"]:
        """Mixture of experts only: each expert's weighted write, expert_weights[e] * post[e] @ W_out[e] (zero
        where not routed). They sum to `out`; with post-norms, to the output before the post-norm."""
        return self._get("expert_out")

    @property
    def out(self) -> Float[Tensor, "batch pos d_model"]:
        """The sublayer's write: post @ W_out + b_out, or the sum of expert_out (through the post-norm in
        models that have one)."""
        return self._get("out")


class CrossRecord(AttnRecord):
    """A decoder's cross-attention (encoder-decoder models): queries from the decoder stream, keys and values
    from the encoder's final hidden state, so k and v are [batch src_pos kv_head d_head] and the pattern is
    [batch head pos src_pos]. Head h writes z[..., h, :] @ W_O[h] into the decoder stream, like self-attention."""

    _part = "cross"


@dataclass(frozen=True)
class LayerRecord:
    attn: AttnRecord
    mlp: MLPRecord
    cross: CrossRecord | None = None  # decoders of encoder-decoder models only
    # What interventions on this layer's residual sites added to the residual ("resid_pre", "resid_mid",
    # "resid_cross", "resid_post" -> new - old, [batch pos d_model]); empty without such edits
    deltas: dict[str, Tensor] = field(default_factory=dict)


def same_fields(config: ModelConfig, cross: bool = False) -> dict[str, str]:
    """The attention fields that are another field in this model, kept once and read from it: the projections
    q_proj and k_proj are q and k where no q/k norm and no rotary embedding (which cross-attention never has)
    transforms them."""
    transformed = config.qk_norm != "none" or (config.positions == "rotary" and not cross)
    return {} if transformed else {"q_proj": "q", "k_proj": "k"}


def absent_fields(config: ModelConfig, layer: int) -> tuple[dict[str, str], dict[str, str]]:
    """(attention, MLP) fields `layer` of this model does not have, each with the reason a read of it reports."""
    absent = {}
    if not config.pre_norms:
        absent["normalized"] = absent["norm_scale"] = "this model's sublayers read the residual without a norm"
    if not config.post_norms:
        absent["post_norm_scale"] = "this model has no post-norms (its sublayer outputs are written as they are)"
    if not config.post_ln:
        absent["resid_norm_scale"] = "this model is pre-LN: its residual is not normed after each write"
    if not config.kv_rank:
        absent["kv_latent"] = absent["kv_norm_scale"] = "this model's attention has no latent (only DeepSeek's does)"
    if config.has_experts(layer):
        dense = "this layer's MLP is a mixture of experts; each expert's coefficients are in `post`"
        mlp_absent = {"pre": dense, "gate": dense}
    else:
        experts = "this layer's MLP is dense, not a mixture of experts"
        mlp_absent = dict.fromkeys(("router_logits", "expert_weights", "expert_out"), experts)
        if not config.gated_mlp:
            mlp_absent["gate"] = "this model's MLP is not gated (post = act(pre))"
    return absent, {**absent, **mlp_absent}
