"""ModelConfig: everything that distinguishes one Transformer architecture from another.

An architecture in resid is a config plus a weight-key table (resid/load/), never a branch on its name in the
forward pass: GPT-2, Llama 1-3, Mistral, Qwen2/3, GPT-NeoX, Gemma 1-3, Phi-3, OLMo 2, Mixtral and BERT differ
only in the values below (norm placement, q/k norms, soft caps, per-layer windows and rope bases, experts,
post-LN, bidirectional attention, the output head); DeepSeek V2/V3 add latent attention (kv_rank, q_rank,
d_head_v, rotary_pairs), shared experts, dense first layers and their routers' rules (router_*).
"""

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Literal

from resid.errors import ResidError


def finite_number(value: object) -> bool:
    """A real number (not a boolean, not NaN or an infinity): every check of a real setting starts here."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


LayerType = Literal["full", "sliding"]  # global attention, or a sliding window (and the local rope base)


@dataclass(frozen=True)
class RopeScaling:
    """Rotary scaling as transformers computes it (modeling_rope_utils), for the layers it applies to:

    linear   every frequency divided by `factor` (position interpolation)
    dynamic  NTK-aware: past `original_n_ctx` positions the base grows with the sequence length
    llama3   low frequencies divided by `factor`, high ones kept, a smooth ramp between (Llama 3.1+)
    yarn     NTK-by-parts ramp between interpolation and extrapolation, cos/sin times `attention_factor`
    factors  each frequency divided by its own factor, given (llama.cpp's rope_freqs tensor: how GGUF files
             store Llama 3.1+ scaling, precomputed)
    """

    kind: Literal["linear", "dynamic", "llama3", "yarn", "factors"]
    factor: float
    original_n_ctx: int | None = None  # the pre-training context (llama3, yarn, dynamic)
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn: None = 0.1 ln(factor) + 1 (or the mscale ratio)
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    truncate: bool = True  # yarn: round the correction range to whole dims
    factors: tuple[float, ...] | None = None  # factors: one divisor per rotary frequency (rotary_dims / 2)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # family the weights came from ("llama", "gpt2", ...): provenance only, never branched on
    d_model: int  # residual stream width
    n_layers: int  # number of blocks
    n_heads: int  # query heads per attention sublayer
    n_kv_heads: int  # key/value heads; < n_heads means grouped-query attention
    d_head: int  # per-head width (not always d_model // n_heads, e.g. Gemma)
    d_mlp: int  # MLP hidden width (number of neurons)
    d_vocab: int  # vocabulary size (rows of W_E, columns of W_U)
    n_ctx: int  # longest sequence the model accepts (learned positions or trained context)
    norm: Literal["layernorm", "rmsnorm"]  # LayerNorm centres and scales; RMSNorm only scales
    norm_eps: float  # epsilon inside the square root of every norm
    norm_gain_offset: float = 0.0  # gain = offset + w; Gemma stores w - 1 and uses 1 + w
    block: Literal["sequential", "parallel"] = "sequential"  # parallel: attn and MLP both read resid_pre
    # learned: W_pos added to the embedding; sinusoidal: the fixed table of Vaswani et al. 2017 added instead;
    # relative: nothing added, each self-attention score gets a learned bias per head and relative-distance
    # bucket (T5: log-spaced buckets, bidirectional in encoders, causal in decoders)
    positions: Literal["learned", "rotary", "sinusoidal", "relative"] = "rotary"
    relative_buckets: int = 32  # relative: number of buckets (half per direction when bidirectional)
    relative_max_distance: int = 128  # relative: distances >= this share the last bucket
    relative_bias_per_layer: bool = False  # relative: every layer has its own table (umT5); else layer 0's is shared
    # sinusoidal table layout: sin and cos interleaved (the 2017 formula, dims 2i / 2i+1) or all sines then all
    # cosines (Marian, fairseq)
    sinusoid_layout: Literal["interleaved", "halves"] = "interleaved"
    rotary_dim: int | None = None  # leading dims of each head that rotate (partial rotary); None = d_head
    rotary_base: float = 10000.0  # theta of the rotary frequencies (of "full" layers, when they differ)
    rope_scaling: RopeScaling | None = None  # scaling of the "full" layers' rotary frequencies
    rotary_base_local: float | None = None  # "sliding" layers' theta, unscaled (Gemma 3); None = as "full"
    # layers whose attention has no position embedding at all (NoPE: SmolLM3 every 4th layer, Cohere 2 and
    # EXAONE 4 their global layers): q and k are not rotated there
    nope_layers: tuple[int, ...] = ()
    attn_qkv_bias: bool = False  # q, k and v projections have biases (GPT-2, Qwen2, GPT-NeoX)
    attn_out_bias: bool = False  # output projection has a bias (GPT-2, GPT-NeoX)
    attn_scale: float | None = None  # multiplies q.k; None = 1 / sqrt(d_head)
    sliding_window: int | None = None  # each query sees at most this many keys (itself included)
    layer_types: tuple[LayerType, ...] | None = None  # per layer; None = all "sliding" with a window, else "full"
    pre_norms: bool = True  # each sublayer reads a norm of the residual (OLMo 2 reads the residual itself)
    post_norms: bool = False  # each sublayer's output is normed before it is written (Gemma 2/3, OLMo 2)
    # post-LN (the original Transformer, BERT): the residual itself is normed after each write is added,
    # x = LN(x + sublayer(x)); the sublayers read x as it is (no pre-norms)
    post_ln: bool = False
    embed_norm: bool = False  # a norm of the summed embeddings before the first block (BERT)
    final_norm: bool = True  # a norm before the head (pre-LN models); BERT ends on its last block's norm
    # the final norm's output is multiplied by this (T5 v1.0 rescales its decoder's output by d_model^-0.5 before
    # the tied head); resid folds it into that norm's gain, so the final hidden state is the head's input
    final_norm_multiplier: float = 1.0
    causal: bool = True  # False: every position reads every real position (encoders: BERT)
    # decoders of encoder-decoder models: a cross-attention sublayer after self-attention reads the encoder's
    # final hidden state (queries from the decoder stream, keys and values from the source)
    cross_attention: bool = False
    n_token_types: int = 0  # > 0: a learned token-type (segment) embedding is added (BERT; single texts: type 0)
    head: Literal["lm", "mlm", "none"] = "lm"  # the unembedding; "mlm": BERT's transform (dense, act, norm)
    # before a biased decoder; "none": an embedding model, whose output is the final hidden state
    qk_norm: Literal["none", "head", "all"] = "none"  # RMSNorm of q and k before rotary: per head (Qwen3,
    # Gemma 3) or over all heads together (OLMo 2)
    qk_norm_after_rotary: bool = False  # the q/k norms act on the rotated q and k (Hunyuan), not before rotary
    attn_softcap: float | None = None  # scores become cap * tanh(scores / cap) (Gemma 2)
    final_softcap: float | None = None  # logits become cap * tanh(logits / cap) (Gemma 2)
    act: Literal["gelu", "gelu_new", "relu", "silu", "relu2", "xielu", "clamped_swiglu"] = "silu"  # gelu_new:
    # gelu's tanh approximation; relu2: relu(x)^2; xielu: Apertus' activation with learned scalars
    # (resid.components.xielu); clamped_swiglu: gpt-oss's experts (resid.components.clamped_glu, glu_limit, glu_alpha)
    glu_limit: float = 7.0  # clamped_swiglu: the clamp of both branches
    glu_alpha: float = 1.702  # clamped_swiglu: the gate's sigmoid slope
    gated_mlp: bool = True  # post = act(x W_gate) * (x W_in): SwiGLU with silu, GeGLU with gelu(_new)
    mlp_bias: bool = False  # W_in, W_gate and W_out have biases
    tie_embeddings: bool = False  # W_U is W_E transposed (one tensor)
    unembed_bias: bool = False  # the unembedding has a bias b_U
    embed_scale: float = 1.0  # the token embedding is multiplied by this (Gemma: sqrt(d_model))
    n_experts: int = 0  # > 0: each MLP is a sparse mixture of this many experts of width d_mlp (Mixtral)
    experts_per_token: int = 0  # experts each token is routed to (top-k of the router's scores)
    # DeepSeek's mixtures: the last n_shared_experts of the n_experts are shared, read by every token with weight 1
    # (the router chooses among the others); the first n_dense_layers layers have a dense MLP of width d_mlp_dense
    # instead of experts (d_mlp is each expert's width)
    n_shared_experts: int = 0
    n_dense_layers: int = 0
    d_mlp_dense: int | None = None  # None = d_mlp
    router: Literal["softmax", "sigmoid"] = "softmax"  # the router's scores of its logits (DeepSeek V3: sigmoid)
    router_renormalize: bool = True  # the chosen experts' scores divided by their sum (Mixtral; norm_topk_prob)
    router_scale: float = 1.0  # the chosen experts' weights multiplied by this (routed_scaling_factor)
    # group-limited routing: the routed experts in router_groups equal groups, a group scored by its best expert
    # ("max", DeepSeek V2) or its two best ("top2", V3), each token choosing among the router_topk_groups best groups
    router_groups: int = 1
    router_topk_groups: int = 1
    router_group_score: Literal["max", "top2"] = "max"
    router_bias: bool = False  # a learned bias added to the scores to choose experts, not to weigh them (V3)
    shared_expert_gate: bool = False  # the shared experts weighted by sigmoid(x W_shared_gate) per token (Qwen2 MoE)
    router_logit_bias: bool = False  # a learned bias added to the router's logits, choosing and weighing (gpt-oss)
    expert_bias: bool = False  # every expert's W_in, W_gate and W_out have biases (gpt-oss)
    attn_sinks: bool = False  # one learned sink logit per head joins every softmax (gpt-oss; resid.components.sinks)
    # multi-head latent attention (DeepSeek V2/V3, resid.components.latent): each head's keys and values read a
    # compressed latent of width kv_rank (> 0), the last rotary_dim dims of its keys one rotary key shared by all
    # heads; queries read a latent of width q_rank (> 0; 0: projected directly); values and z have d_head_v dims
    kv_rank: int = 0
    q_rank: int = 0
    d_head_v: int | None = None  # None = d_head
    # which dims rotate together: (i, i + rotary_dims / 2), Hugging Face's rotate_half, or (2i, 2i + 1) (DeepSeek)
    rotary_pairs: Literal["halves", "interleaved"] = "halves"

    def __post_init__(self) -> None:
        if isinstance(self.rope_scaling, dict):  # from to_dict()
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
        scaling = self.rope_scaling
        if scaling is not None and scaling.factors is not None:
            object.__setattr__(scaling, "factors", tuple(float(f) for f in scaling.factors))
        if self.layer_types is not None:
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        object.__setattr__(self, "nope_layers", tuple(self.nope_layers))
        problems = []
        if self.layer_types is not None:
            if len(self.layer_types) != self.n_layers or not set(self.layer_types) <= {"full", "sliding"}:
                problems.append(f"layer_types must give 'full' or 'sliding' for each of the {self.n_layers} layers")
            elif "sliding" in self.layer_types and self.sliding_window is None:
                problems.append("layer_types has 'sliding' layers but sliding_window is None")
        routed = self.n_experts - self.n_shared_experts
        if self.n_experts and not 0 < self.experts_per_token <= routed:
            problems.append(f"experts_per_token={self.experts_per_token} must be in 1..{routed} (the routed experts)")
        problems += self._expert_problems() + self._latent_problems()
        if scaling is not None and (scaling.kind == "factors") != (scaling.factors is not None):
            problems.append("rope_scaling has per-frequency factors exactly when its kind is 'factors'")
        elif scaling is not None and scaling.kind == "factors" and len(scaling.factors) * 2 != self.rotary_dims:
            problems.append(f"rope_scaling gives {len(scaling.factors)} factors "
                            f"for {self.rotary_dims // 2} frequencies")
        if self.nope_layers and (self.positions != "rotary" or self.kv_rank
                                 or not all(0 <= n < self.n_layers for n in self.nope_layers)):
            problems.append(f"nope_layers={self.nope_layers} must be layers (0..{self.n_layers - 1}) of a model with "
                            "rotary positions and standard attention")
        if self.act == "clamped_swiglu" and not self.n_experts:
            problems.append("the clamped_swiglu activation is for experts only (n_experts > 0)")
        if (self.router_logit_bias or self.expert_bias) and not self.n_experts:
            problems.append("router_logit_bias and expert_bias need experts (n_experts > 0)")
        if self.attn_sinks and (self.kv_rank or self.cross_attention):
            problems.append("attn_sinks are for standard self-attention (no latent attention, no cross-attention)")
        if self.shared_expert_gate and not self.n_shared_experts:
            problems.append("shared_expert_gate needs shared experts (n_shared_experts > 0)")
        if self.act == "xielu" and (self.n_experts or self.head == "mlm"):
            problems.append("the xielu activation (learned per layer) is for dense MLPs only, not experts or MLM "
                            "heads")
        if self.qk_norm_after_rotary and (self.qk_norm != "head" or self.positions != "rotary"):
            problems.append("qk_norm_after_rotary needs per-head q/k norms (qk_norm 'head') and rotary positions")
        if not (self.pre_norms or self.post_norms or self.post_ln):
            problems.append("a model needs pre_norms, post_norms or post_ln")
        if self.post_ln and (self.pre_norms or self.post_norms or self.block == "parallel"):
            problems.append("post_ln blocks are sequential and have no pre_norms or post_norms")
        if self.cross_attention and self.block == "parallel":
            problems.append("cross_attention needs sequential blocks")
        exact = self.relative_buckets // (1 if self.causal else 2) // 2  # buckets of single distances
        if self.positions == "relative" and not (exact >= 1 and self.relative_max_distance > exact):
            problems.append(f"relative positions need at least {2 if self.causal else 4} relative_buckets and a "
                            "relative_max_distance beyond the exact buckets (a quarter of them, bidirectional)")
        if self.final_norm_multiplier != 1.0 and not self.final_norm:
            problems.append("final_norm_multiplier needs a final norm to fold into")
        if self.positions == "sinusoidal" and self.d_model % 2:
            problems.append(f"sinusoidal positions need an even d_model, got {self.d_model}")
        if self.n_heads % self.n_kv_heads:
            problems.append(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        rotary_dim = self.rotary_dim if self.rotary_dim is not None else self.d_head
        if self.positions == "rotary" and (rotary_dim % 2 or not 0 < rotary_dim <= self.d_head):
            problems.append(f"rotary_dim={rotary_dim} must be even and in (0, d_head={self.d_head}]")
        for name in ("d_model", "n_layers", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx"):
            if getattr(self, name) <= 0:
                problems.append(f"{name}={getattr(self, name)} must be positive")
        problems += self._number_problems()
        if problems:
            raise ResidError("Invalid ModelConfig: " + "; ".join(problems) + ". Fix these fields.")

    def _expert_problems(self) -> list[str]:
        problems = []
        if not self.n_experts and (self.n_shared_experts or self.n_dense_layers or self.d_mlp_dense is not None):
            problems.append("n_shared_experts, n_dense_layers and d_mlp_dense need experts (n_experts > 0)")
        if not 0 <= self.n_shared_experts < max(self.n_experts, 1):
            problems.append(f"n_shared_experts={self.n_shared_experts} must leave routed experts of "
                            f"n_experts={self.n_experts}")
        if not 0 <= self.n_dense_layers <= self.n_layers:
            problems.append(f"n_dense_layers={self.n_dense_layers} must be in 0..n_layers={self.n_layers}")
        if self.d_mlp_dense is not None and self.d_mlp_dense <= 0:
            problems.append(f"d_mlp_dense={self.d_mlp_dense} must be positive")
        routed = self.n_experts - self.n_shared_experts
        groups, top = self.router_groups, self.router_topk_groups
        if self.n_experts and (groups < 1 or routed % groups or not 1 <= top <= groups):
            problems.append(f"router_groups={groups} must divide the {routed} routed experts, and "
                            f"router_topk_groups={top} be in 1..router_groups")
        elif self.n_experts and self.experts_per_token > top * (routed // groups):
            problems.append(f"experts_per_token={self.experts_per_token} exceeds the experts of the "
                            f"{top} groups a token may choose ({top * (routed // groups)})")
        elif self.n_experts and self.router_group_score == "top2" and groups > 1 and routed // groups < 2:
            problems.append("router_group_score 'top2' needs at least 2 experts per group")
        return problems

    def _latent_problems(self) -> list[str]:
        if not self.kv_rank:
            if self.q_rank or self.d_head_v is not None or self.rotary_pairs != "halves":
                return ["q_rank, d_head_v and rotary_pairs 'interleaved' belong to latent attention (kv_rank > 0)"]
            return []
        problems = []
        if self.kv_rank < 0 or self.q_rank < 0 or (self.d_head_v is not None and self.d_head_v <= 0):
            problems.append("kv_rank, q_rank and d_head_v must be positive (q_rank 0: no query latent)")
        if self.positions != "rotary" or self.rotary_dim is None:
            problems.append("latent attention needs rotary positions and rotary_dim (the shared rotary key's width)")
        if self.n_kv_heads != self.n_heads:
            problems.append("latent attention gives every head its own keys and values: n_kv_heads = n_heads")
        if self.cross_attention or self.qk_norm != "none" or self.attn_qkv_bias or self.attn_softcap is not None:
            problems.append("latent attention has no cross-attention, q/k norms, q/k/v biases or soft cap")
        return problems

    def _number_problems(self) -> list[str]:
        """The real-valued fields: finite, and positive where a zero or a sign flip would be a different model
        (a NaN rotary base computes finite logits that are wrong by several units, so it is refused here too,
        whatever loader or caller built the config)."""
        scaling = self.rope_scaling
        positive = {"rotary_base": self.rotary_base, "embed_scale": self.embed_scale,
                    "final_norm_multiplier": self.final_norm_multiplier, "rotary_base_local": self.rotary_base_local,
                    "attn_scale": self.attn_scale, "attn_softcap": self.attn_softcap,
                    "final_softcap": self.final_softcap, "router_scale": self.router_scale,
                    "glu_limit": self.glu_limit, "glu_alpha": self.glu_alpha}
        # norm_eps 0 is a real (if fragile) choice, and mscale 0 is DeepSeek's "none"
        non_negative = {"norm_eps": self.norm_eps}
        finite = {"norm_gain_offset": self.norm_gain_offset}
        if scaling is not None:
            positive |= {f"rope_scaling.{name}": getattr(scaling, name) for name in (
                "factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "attention_factor")}
            positive |= {f"rope_scaling.factors[{i}]": f for i, f in enumerate(scaling.factors or ())}
            non_negative |= {"rope_scaling.mscale": scaling.mscale,
                             "rope_scaling.mscale_all_dim": scaling.mscale_all_dim}
        rules = ((positive, "a finite positive number", lambda v: v > 0),
                 (non_negative, "a finite number of at least 0", lambda v: v >= 0),
                 (finite, "a finite number", lambda v: True))
        return [f"{name}={value!r} must be {rule}" for fields, rule, holds in rules for name, value in fields.items()
                if value is not None and not (finite_number(value) and holds(value))]

    @property
    def rotary_dims(self) -> int:
        """Dims of each head that rotate (0 for learned positions)."""
        if self.positions != "rotary":
            return 0
        return self.rotary_dim if self.rotary_dim is not None else self.d_head

    def layer_type(self, layer: int) -> LayerType:
        """Whether `layer` attends globally or within the sliding window (with the local rope base)."""
        if self.layer_types is not None:
            return self.layer_types[layer]
        return "sliding" if self.sliding_window is not None else "full"

    def rotates(self, layer: int) -> bool:
        """Whether `layer`'s attention rotates q and k (rotary positions, not a NoPE layer)."""
        return self.positions == "rotary" and layer not in self.nope_layers

    def has_experts(self, layer: int) -> bool:
        """Whether `layer`'s MLP is a mixture of experts (DeepSeek's first n_dense_layers are dense)."""
        return self.n_experts > 0 and layer >= self.n_dense_layers

    def mlp_width(self, layer: int) -> int:
        """Neurons of `layer`'s MLP, or of each of its experts."""
        dense = not self.has_experts(layer) and self.d_mlp_dense is not None
        return self.d_mlp_dense if dense else self.d_mlp

    @property
    def v_width(self) -> int:
        """Dims of each head's values and z (d_head, or latent attention's d_head_v)."""
        return self.d_head if self.d_head_v is None else self.d_head_v

    @property
    def layer_types_used(self) -> frozenset[str]:
        return frozenset(self.layer_type(layer) for layer in range(self.n_layers))

    def window(self, layer_type: LayerType) -> int | None:
        return self.sliding_window if layer_type == "sliding" else None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
