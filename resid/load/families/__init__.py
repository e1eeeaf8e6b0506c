"""One module per architecture family: how its config.json maps to a ModelConfig and where each of its
checkpoint tensors goes (an explicit key table). Adding a family never touches the forward pass."""

import dataclasses
import numbers
import re
from collections.abc import Callable
from dataclasses import dataclass

from resid.config import ModelConfig, RopeScaling, finite_number
from resid.errors import ResidError
from resid.load.weights import Key


@dataclass(frozen=True)
class Family:
    model_types: tuple[str, ...]  # config.json "model_type" values this family reads
    config: Callable[[dict], ModelConfig]  # config.json -> ModelConfig
    keys: Callable[[ModelConfig], list[Key]]  # the key table, expanded per layer
    # The defaults are the Llama layout most families share: a "model." backbone, an "lm_head" unembedding, and
    # the rotary frequencies some older checkpoints saved as a buffer.
    prefix: str = "model."  # prefix of the backbone's tensors in a *ForCausalLM checkpoint ("transformer.", ...)
    head_keys: tuple[str, ...] = ("lm_head.weight",)  # tensors outside the backbone (the LM head)
    ignore: tuple[str, ...] = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",)  # regexes of checkpoint
    # tensors that are not weights (cached masks, buffers)
    prepend_bos: bool = False  # BOS policy when tokenizer_config.json does not say (add_bos_token)
    template: bool = False  # the tokenizer's own template adds the special tokens ([CLS] text [SEP]) instead
    fields: frozenset[str] = frozenset()  # config.json fields `config` reads or checks (see check_model_fields)
    # encoder-decoder families (a resid.EncoderDecoder): `config` gives the decoder, `encoder` the encoder, and
    # `seq2seq_keys(encoder, decoder, config.json)` the key table of both (targets under encoder. / decoder.)
    encoder: Callable[[dict], ModelConfig] | None = None
    seq2seq_keys: Callable[[ModelConfig, ModelConfig, dict], list[Key]] | None = None
    # a key table that also reads config.json, for constants folded into weights (Granite's residual_multiplier);
    # the Hugging Face loader takes it over `keys`
    hf_keys: Callable[[ModelConfig, dict], list[Key]] | None = None

    def read(self, hf: dict, where: str = "config.json") -> ModelConfig:
        """config.json -> ModelConfig, refusing fields this family does not know (check_model_fields), sizes that are
        not whole numbers of the right range and other malformed values (check_values), and missing fields."""
        check_model_fields(hf, self.fields, where)
        check_values(hf, where)
        try:
            return self.config(hf)
        except KeyError as missing:
            raise ResidError(
                f"{where} has no {missing.args[0]!r}, which model_type {hf.get('model_type')!r} needs. The file is "
                "incomplete; re-export it (transformers' save_pretrained writes every field)."
            ) from None


def hf_get(hf: dict, *names: str, default: object = None) -> object:
    """The first of `names` present in a config.json dict (families renamed fields over time)."""
    for name in names:
        if hf.get(name) is not None:
            return hf[name]
    return default


def activation(name: str) -> str:
    table = {
        "silu": "silu",
        "swish": "silu",
        "gelu": "gelu",
        "gelu_new": "gelu_new",
        "gelu_pytorch_tanh": "gelu_new",
        "gelu_fast": "gelu_new",
        "relu": "relu",
        "relu2": "relu2",
        "xielu": "xielu",
    }
    if name not in table:
        raise ResidError(f"Activation {name!r} is not supported; resid supports {sorted(table)}.")
    return table[name]


# Fields every family may meet that never change the forward pass's numbers: provenance, training-only
# settings, token ids (read by the tokenizer), output switches. Anything else must be read by the family.
HARMLESS = frozenset({
    "_name_or_path", "_model_name_or_path", "_attn_implementation_autoset", "architectures", "auto_map",
    "attention_dropout", "attn_pdrop",
    "bos_token_id", "chunk_size_feed_forward",
    "classifier_dropout", "decoder_start_token_id", "dtype", "embd_pdrop", "eos_token_id", "finetuning_task",
    "hidden_dropout", "id2label", "initializer_range", "is_decoder", "label2id", "model_type", "output_attentions",
    "output_hidden_states", "output_router_logits", "pad_token_id", "prefix", "pretraining_tp", "problem_type",
    "resid_pdrop", "return_dict", "router_aux_loss_coef", "router_jitter_noise", "sep_token_id", "summary_activation",
    "summary_first_dropout", "summary_proj_to_labels", "summary_type", "summary_use_proj", "task_specific_params",
    "tokenizer_class", "torch_dtype", "torchscript", "transformers_version", "use_cache", "use_return_dict",
    "max_length", "min_length", "do_sample", "temperature", "top_k", "top_p", "num_beams", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "num_return_sequences", "early_stopping", "tie_encoder_decoder",
})
# Token ids (unk_token_id, cls_token_id, ..., as transformers names every special token: a "_token_id" suffix,
# or "_token_ids" for a list) are read by the tokenizer or by generation, never by the forward pass. Converted
# checkpoints carry whichever their tokenizer had (transformers writes unk_token_id for a GGUF's tokenizer).
_TOKEN_ID = re.compile(r"\w+_token_ids?")


def _token_ids(name: str, value: object) -> bool:
    values = value if isinstance(value, list) else [value]
    return bool(_TOKEN_ID.fullmatch(name)) and all(
        v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in values)


# Fields that are harmless only at these values (anything else changes the architecture).
HARMLESS_AT = {"is_encoder_decoder": (False, None), "add_cross_attention": (False, None),
               "use_bidirectional_attention": (False, None), "use_mrope": (False, None),
               "quantization_config": (None,)}  # null: transformers writes it for a dequantized GGUF
# Why a field is refused at any other value, where more can be said than that resid does not know it.
REFUSED_BECAUSE = {
    "quantization_config": "resid reads floating-point weights only, and a quantized checkpoint's tensors are "
                           "packed integers and scales; save the model dequantized (transformers: load it, then "
                           "save_pretrained without quantization), or load its GGUF file directly",
}


# Sizes: whole numbers (576, not "576" or 576.0) of at least this, or null where a family derives them. Checked
# before a family reads any, so that a bad one is an error naming the field, not a ZeroDivisionError inside it.
COUNTS = {
    **dict.fromkeys((
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
        "intermediate_size", "vocab_size", "max_position_embeddings", "n_embd", "n_layer", "n_head", "n_inner",
        "n_positions", "n_ctx", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
        "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "decoder_vocab_size", "num_local_experts",
        "num_experts_per_tok", "sliding_window", "sliding_window_pattern", "_sliding_window_pattern",
        "original_max_position_embeddings", "d_kv", "d_ff", "num_layers", "num_decoder_layers", "num_heads",
        "relative_attention_max_distance",
        # DeepSeek
        "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_head_dim", "v_head_dim", "moe_intermediate_size",
        "n_routed_experts", "n_group", "topk_group", "moe_layer_freq",
    ), 1),
    "relative_attention_num_buckets": 2, "qk_rope_head_dim": 2,
    "type_vocab_size": 0, "max_window_layers": 0, "n_shared_experts": 0, "first_k_dense_replace": 0,
    "num_nextn_predict_layers": 0,
}
# Real numbers that must be finite and positive (or null where optional): epsilons, rotary bases and fractions,
# soft caps, the attention scale. NaN, Infinity and 0 are refused, never replaced by a default: a NaN rotary base
# loads and gives finite logits that are wrong by several units.
POSITIVE = frozenset({
    "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "rope_theta", "rope_local_base_freq", "rotary_emb_base",
    "partial_rotary_factor", "rotary_pct", "attn_logit_softcapping", "final_logit_softcapping",
    "query_pre_attn_scalar", "routed_scaling_factor",
    "embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling", "logit_scale",
})
# Of those, the fractions of each head's dims that rotate: at most 1.
FRACTIONS = frozenset({"partial_rotary_factor", "rotary_pct"})
# Switches: a JSON true or false. A string "false" would read as true.
BOOLS = frozenset({
    "attention_bias", "mlp_bias", "tie_word_embeddings", "use_sliding_window", "use_parallel_residual",
    "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention",
    "is_decoder", "is_encoder_decoder", "scale_embedding", "static_position_embeddings", "normalize_before",
    "add_final_layer_norm", "normalize_embedding", "add_bias_logits", "share_encoder_decoder_embeddings",
    "scale_decoder_outputs", "use_bidirectional_attention", "use_mrope", "norm_topk_prob", "rope_interleave",
})
# The rotary parameters (rope_parameters, or the older rope_scaling; nested per layer type in Gemma 3): the base
# and the scaling's numbers are finite and positive (mscale, mscale_all_dim may be 0: DeepSeek's "no mscale"),
# the pre-training context a size, truncate a switch.
ROPE_NESTS = ("rope_parameters", "rope_scaling")
ROPE_POSITIVE = frozenset({"rope_theta", "factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow",
                           "attention_factor", "partial_rotary_factor"})
ROPE_NON_NEGATIVE = frozenset({"mscale", "mscale_all_dim"})


def _kind(value: object) -> str:
    return ("a string" if isinstance(value, str) else "a boolean" if isinstance(value, bool)
            else "a list" if isinstance(value, list) else "an object" if isinstance(value, dict)
            else type(value).__name__)


def check_values(hf: dict, where: str) -> None:
    """Refuse a size that is not a whole number of its range, a number field that is not a finite positive
    number, a switch that is not a JSON boolean, or rotary parameters of the wrong kind, naming the field and
    saying what it holds."""
    for name, value in hf.items():
        if value is None:
            continue
        if name == "sliding_window" and value == 0 and hf.get("use_sliding_window") is False:
            continue  # no window: transformers writes 0 there for Qwen2 MoE (use_sliding_window false)
        if name in COUNTS:
            _check_count(name, value, COUNTS[name], where)
        elif name in POSITIVE:
            if not finite_number(value) or value <= 0 or (name in FRACTIONS and value > 1):
                rule = "a number in (0, 1]" if name in FRACTIONS else "a finite positive number"
                raise ResidError(f"{where}: {name} must be {rule}, but it is {value!r} ({_kind(value)}). Fix that "
                                 "field of config.json.")
        elif name in BOOLS and not isinstance(value, bool):
            raise ResidError(f"{where}: {name} must be true or false (a JSON boolean, without quotes), but it is "
                             f"{value!r} ({_kind(value)}). Fix that field of config.json.")
        elif name in ROPE_NESTS:
            _check_rope(value, name, where)


def _check_count(name: str, value: object, least: int, where: str) -> None:
    whole = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not whole or value < least:
        shown = f"{value!r} ({_kind(value)})" if not whole else repr(value)
        raise ResidError(
            f"{where}: {name} must be a whole number of at least {least}, written without quotes or a decimal "
            f"point (e.g. 576), but it is {shown}. Fix that field of config.json."
        )


def _check_rope(params: object, path: str, where: str, nested: bool = True) -> None:
    if not isinstance(params, dict):
        raise ResidError(f"{where}: {path} must be an object of rotary parameters (e.g. {{\"rope_type\": "
                         f"\"default\", \"rope_theta\": 10000.0}}), but it is {params!r} ({_kind(params)}). Fix that "
                         "field of config.json.")
    for name, value in params.items():
        field = f"{path}.{name}"
        if value is None:
            continue
        if isinstance(value, dict) and nested:  # per layer type (Gemma 3: full_attention, sliding_attention)
            _check_rope(value, field, where, nested=False)
        elif name in ROPE_POSITIVE or name in ROPE_NON_NEGATIVE:
            positive = name in ROPE_POSITIVE
            fraction = name == "partial_rotary_factor"
            if not finite_number(value) or (value <= 0 if positive else value < 0) or (fraction and value > 1):
                rule = ("a number in (0, 1]" if fraction else "a finite positive number" if positive
                        else "a finite number of at least 0")
                raise ResidError(f"{where}: {field} must be {rule}, but it is {value!r} ({_kind(value)}). Fix "
                                 "that field of config.json.")
        elif name == "original_max_position_embeddings":
            _check_count(field, value, 1, where)
        elif name == "truncate" and not isinstance(value, bool):
            raise ResidError(f"{where}: {field} must be true or false (a JSON boolean, without quotes), but it is "
                             f"{value!r} ({_kind(value)}). Fix that field of config.json.")


def check_model_fields(hf: dict, fields: frozenset[str], where: str) -> None:
    """Refuse a config.json field that is neither read by the family (`fields`) nor known to be harmless:
    a new rope type, norm placement or attention variant must never load as a silently wrong model."""
    unknown = sorted(
        name for name, value in hf.items()
        if name not in fields and name not in HARMLESS and not (name in HARMLESS_AT and value in HARMLESS_AT[name])
        and not _token_ids(name, value)
    )
    if unknown:
        shown = ", ".join(f"{name}={hf[name]!r}" for name in unknown)
        reasons = "".join(f" {name}: {REFUSED_BECAUSE[name]}." for name in unknown if name in REFUSED_BECAUSE)
        raise ResidError(
            f"{where} has config field(s) resid does not know for model_type {hf.get('model_type')!r}: {shown}. "
            "They may change the architecture, so resid refuses rather than compute a wrong model; if they are "
            f"harmless for this model, please report it (or remove them from config.json).{reasons}"
        )


ROPE_FIELDS = frozenset({
    "rope_type", "type", "rope_theta", "factor", "original_max_position_embeddings", "low_freq_factor",
    "high_freq_factor", "beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim", "truncate",
    "partial_rotary_factor",
})
SCALINGS = ("linear", "dynamic", "llama3", "yarn")
# config.json fields the rotary reading below handles, for each family's `fields`
ROPE_CONFIG_FIELDS = frozenset({"rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor",
                                "original_max_position_embeddings", "max_position_embeddings"})


@dataclass(frozen=True)
class Rope:
    base: float
    scaling: RopeScaling | None
    partial: float  # the fraction of each head's dims that rotate


def rope(hf: dict, layer_type: str | None = None, default_base: float = 10000.0) -> Rope:
    """The rotary of a config.json (for one layer type when its rope_parameters are nested by layer type):
    old style (rope_theta + rope_scaling) or transformers 5's rope_parameters. Unknown schemes and fields are
    refused."""
    params = dict(hf.get("rope_parameters") or {})
    if layer_type is not None and layer_type in params:
        params = dict(params[layer_type] or {})
    elif any(isinstance(v, dict) for v in params.values()):
        nested = sorted(k for k, v in params.items() if isinstance(v, dict))
        raise ResidError(f"config.json has rope_parameters per layer type {nested}, which this family does not use.")
    params = {**(hf.get("rope_scaling") or {}), **params}
    unknown = sorted(set(params) - ROPE_FIELDS)
    if unknown:
        raise ResidError(f"config.json's rope parameters have field(s) {unknown} that resid does not know; refusing.")
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind not in ("default", *SCALINGS):
        raise ResidError(
            f"Rotary scaling {kind!r} is not supported; resid computes 'default' and {', '.join(map(repr, SCALINGS))} "
            "as transformers does. Use a model with one of those."
        )
    # check_values refused a 0 or NaN, so a missing field is the only reason to take the default
    base = float(hf_get(params, "rope_theta", default=hf_get(hf, "rope_theta", default=default_base)))
    partial = float(hf_get(params, "partial_rotary_factor", default=hf_get(hf, "partial_rotary_factor", default=1.0)))
    if kind == "default":
        return Rope(base, None, partial)
    n_ctx = hf["max_position_embeddings"]
    original = hf.get("original_max_position_embeddings") or params.get("original_max_position_embeddings")
    if kind == "dynamic":
        original = n_ctx  # transformers grows the base past max_position_embeddings
    original = original or n_ctx
    factor = params.get("factor")
    if factor is None and kind == "yarn":
        factor = n_ctx / original
    if factor is None:
        raise ResidError(f"config.json's {kind!r} rope scaling has no factor; the file is incomplete.")
    optional = {name: float(params[name]) for name in ("low_freq_factor", "high_freq_factor", "beta_fast",
                                                       "beta_slow", "attention_factor", "mscale", "mscale_all_dim")
                if params.get(name) is not None}
    if params.get("truncate") is not None:
        optional["truncate"] = bool(params["truncate"])
    original = None if kind == "linear" else int(original)  # linear scaling has no pre-training context
    return Rope(base, RopeScaling(kind, float(factor), original, **optional), partial)


def context(hf: dict, rope_: Rope) -> int:
    """The longest sequence resid accepts: max_position_embeddings, or past it under dynamic scaling (whose
    base grows with the sequence)."""
    n_ctx = hf["max_position_embeddings"]
    if rope_.scaling is not None and rope_.scaling.kind == "dynamic":
        return int(n_ctx * rope_.scaling.factor)
    return n_ctx


def layer_types(hf: dict, n_layers: int) -> tuple[str, ...] | None:
    """config.json's layer_types as resid's "full" / "sliding" (None when absent)."""
    given = hf.get("layer_types")
    if given is None:
        return None
    names = {"full_attention": "full", "sliding_attention": "sliding"}
    unknown = sorted(set(given) - set(names))
    if unknown or len(given) != n_layers:
        raise ResidError(
            f"config.json's layer_types {given} must name 'full_attention' or 'sliding_attention' for each of its "
            f"{n_layers} layers; {unknown or 'the count differs'}."
        )
    return tuple(names[t] for t in given)


def rope_base(hf: dict) -> float:
    """rope_theta of a config.json with plain rotary (families that take no scaling)."""
    found = rope(hf)
    if found.scaling is not None:
        raise ResidError(f"Rotary scaling {found.scaling.kind!r} is not supported for this family yet.")
    return found.base


def rotary_halves(n_heads: int, d_head: int, rotary_dims: int) -> tuple[int, ...]:
    """The row order that turns a projection whose rotary pairs are interleaved, (2i, 2i + 1) as GPT-J, Cohere and
    ERNIE 4.5 rotate them, into rotate_half's layout, (i, i + rotary_dims / 2): each head's even rotary dims first,
    then its odd ones, then the dims that do not rotate. Applied alike to the queries and the keys, it permutes the
    dims of every head's q . k sum, so the scores are the same numbers (captured q and k are in resid's order)."""
    half = rotary_dims // 2
    per_head = [2 * i for i in range(half)] + [2 * i + 1 for i in range(half)] + list(range(rotary_dims, d_head))
    return tuple(head * d_head + dim for head in range(n_heads) for dim in per_head)


def interleaved_rotary(keys: list[Key], config: ModelConfig) -> list[Key]:
    """`keys` with the query and key projections (weights and biases) read in rotary_halves order."""
    orders = {"W_Q": rotary_halves(config.n_heads, config.d_head, config.rotary_dims),
              "b_Q": rotary_halves(config.n_heads, config.d_head, config.rotary_dims),
              "W_K": rotary_halves(config.n_kv_heads, config.d_head, config.rotary_dims),
              "b_K": rotary_halves(config.n_kv_heads, config.d_head, config.rotary_dims)}
    out = []
    for key in keys:
        name = key.attribute.rsplit(".", 1)[-1]
        out.append(dataclasses.replace(key, order=orders[name]) if ".attn." in key.attribute and name in orders
                   else key)
    return out


def scaled(keys: list[Key], attributes: tuple[str, ...], factor: float) -> list[Key]:
    """`keys` with the tensors of `attributes` (ending so: "attn.W_O", "mlp.b_out", ...) multiplied by `factor`: a
    constant multiplier of a sublayer's write folded into its weights (Granite's residual_multiplier)."""
    return [dataclasses.replace(key, scale=factor) if key.attribute.endswith(attributes) else key for key in keys]
