"""SAELens (sae-lens 6; older layouts too): `cfg.json` + `sae_weights.safetensors`.

Tensors (SAELens's own layout, no transposes except W_skip):

    W_enc [d_in d_sae]   W_dec [d_sae d_out]   b_enc [d_sae]   b_dec [d_out]
    threshold [d_sae]    (jumprelu*; older files: log_threshold, threshold = exp(log_threshold))
    b_gate b_mag r_mag [d_sae]   (gated; no b_enc)
    W_skip [d_out d_in]  (skip transcoders: SAELens adds x @ W_skip.T; resid stores it as [d_in d_out])
    scaling_factor       (old files: all ones is dropped, as SAELens does; anything else is refused)

TopK SAEs saved with rescale_acts_by_decoder_norm=True select their top k on the pre-activations times each
feature's decoder norm and divide by that norm again before decoding (SAELens's TopKSAE.encode / decode); resid
folds the norms into the weights at load, as SAELens's fold_W_dec_norm does (W_enc and b_enc times the norm, W_dec
divided by it), which computes the same activations and reconstruction. A folder folded in SAELens keeps the flag
with norms already 1, and folding again changes nothing.

Architectures: standard -> relu, jumprelu -> jumprelu (BatchTopK SAEs are saved so), topk -> topk, gated ->
gated, transcoder / skip_transcoder -> relu transcoders, jumprelu_transcoder / jumprelu_skip_transcoder. Files from
before SAELens 6 keep hook_name (or hook_point), model_name, activation_fn(_str) at the top level.
"""

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from resid.dictionaries.crosslayer import CrossLayerTranscoder
from resid.dictionaries.dictionary import ActivationFunction, Binding, Dictionary, InputNormalization, Weights
from resid.dictionaries.formats import (
    as_bool,
    as_choice,
    as_dict,
    as_index,
    as_int,
    as_str,
    check_dictionary_fields,
    clamp_threshold,
    finite_to_write,
    folder_to_write,
    read_json,
    read_safetensors,
    take,
)
from resid.errors import ResidError

CONFIG, WEIGHTS = "cfg.json", "sae_weights.safetensors"
ARCHITECTURES = {  # architecture -> (activation, transcoder, skip)
    "standard": ("relu", False, False), "jumprelu": ("jumprelu", False, False), "topk": ("topk", False, False),
    "gated": ("gated", False, False), "transcoder": ("relu", True, False), "skip_transcoder": ("relu", True, True),
    "jumprelu_transcoder": ("jumprelu", True, False), "jumprelu_skip_transcoder": ("jumprelu", True, True),
}
# Fields read below (SAELens 6 and older layouts)
READ = frozenset({
    "architecture", "d_in", "d_sae", "d_out", "dtype", "apply_b_dec_to_input", "normalize_activations",
    "reshape_activations", "metadata", "k", "rescale_acts_by_decoder_norm", "model_name", "hook_name", "hook_point",
    "hook_head_index", "hook_point_head_index", "hook_name_out", "hook_head_index_out", "hf_hook_name",
    "hf_hook_name_out", "activation_fn", "activation_fn_str", "activation_fn_kwargs", "finetuning_scaling_factor",
})
# Provenance and training settings that do not change what the dictionary computes
PROVENANCE = frozenset({
    "device", "context_size", "dataset_path", "dataset_trust_remote_code", "prepend_bos", "sae_lens_version",
    "sae_lens_training_version", "neuronpedia_id", "model_class_name", "model_from_pretrained_kwargs",
    "seqpos_slice", "exclude_special_tokens", "hook_layer", "hook_point_layer", "decoder_init_norm",
})
# The type of each field read (at the top level, or in SAELens 6's metadata); checked before any is used
BOOLS = ("apply_b_dec_to_input", "rescale_acts_by_decoder_norm", "finetuning_scaling_factor")
STRINGS = ("architecture", "model_name", "hook_name", "hook_point", "hook_name_out", "hf_hook_name",
           "hf_hook_name_out", "activation_fn", "activation_fn_str", "reshape_activations")
SIZES = ("d_in", "d_sae", "d_out", "k")
HEADS = ("hook_head_index", "hook_point_head_index", "hook_head_index_out")
OBJECTS = ("activation_fn_kwargs", "model_from_pretrained_kwargs")
# SAELens's dtype strings (its str_to_dtype): the weights' dtype is what the safetensors file holds; a dtype
# outside these is a file resid does not understand
DTYPES = tuple(f"{prefix}{name}" for prefix in ("", "torch.") for name in ("float32", "float64", "float16", "bfloat16"))


def read(folder: Path, norm_scaling_factor: float | None = None) -> Dictionary:
    """The dictionary in a SAELens folder. `norm_scaling_factor`: for "expected_average_only_in" files, the
    factor SAELens keeps in its registry (pretrained_saes.yaml) rather than in the folder; it is folded into the
    weights exactly as SAELens's from_pretrained folds it."""
    where = f"{folder / CONFIG}"
    cfg = read_json(folder / CONFIG)
    check_dictionary_fields(cfg, READ | PROVENANCE, where, "a SAELens dictionary")
    metadata = dict(as_dict(cfg.get("metadata"), "metadata", where))
    _check_values(cfg, where)
    _check_values(metadata, f"{where} (metadata)")
    get = lambda name: metadata.get(name, cfg.get(name))  # noqa: E731 (SAELens 6 nests these in metadata)
    architecture = cfg.get("architecture") or _legacy_architecture(cfg, where)
    if architecture not in ARCHITECTURES:
        raise ResidError(f"{where}: architecture {architecture!r} is not one resid computes; it reads "
                         f"{', '.join(ARCHITECTURES)}.")
    activation, transcoder, skip = ARCHITECTURES[architecture]
    d_in, d_sae = as_int(cfg.get("d_in"), "d_in", where), as_int(cfg.get("d_sae"), "d_sae", where)
    d_out = as_int(cfg.get("d_out", d_in), "d_out", where) if transcoder else d_in
    _refuse_unsupported(cfg, where)
    normalize = _normalization(cfg, where)
    found = _tensors(folder / WEIGHTS, activation, skip)
    for name, shape in (("W_enc", (d_in, d_sae)), ("W_dec", (d_sae, d_out))):
        if tuple(found[name].shape) != shape:
            raise ResidError(f"{folder / WEIGHTS}: {name} has shape {list(found[name].shape)}, but {CONFIG} says "
                             f"{list(shape)} (d_in={d_in}, d_sae={d_sae}, d_out={d_out}).")
    if normalize == "expected_average_only_in":
        found = _fold_scaling_factor(found, norm_scaling_factor, where)
        normalize = "none"
    if activation == "topk" and cfg.get("rescale_acts_by_decoder_norm"):  # after the factor, as SAELens orders them
        found = _fold_decoder_norms(found, folder / WEIGHTS)
    head = get("hook_head_index") if get("hook_head_index") is not None else get("hook_point_head_index")
    hook_in = get("hf_hook_name") or get("hook_name") or get("hook_point")
    hook_out = (get("hf_hook_name_out") or get("hook_name_out")) if transcoder else None
    return Dictionary(
        Weights(found["W_enc"], found["W_dec"], found["b_dec"], found.get("b_enc"),
                found["W_skip"].T.contiguous() if skip else None),
        ActivationFunction(activation, clamp_threshold(found["threshold"]) if "threshold" in found else None,
                           cfg.get("k") if activation == "topk" else None, found.get("b_gate"), found.get("b_mag"),
                           found.get("r_mag")),
        normalization=InputNormalization(normalize, cfg.get("apply_b_dec_to_input", True) and not transcoder),
        binding=Binding(hook_in, hook_out or (None if transcoder else hook_in), transcoder=transcoder),
        name=folder.name, format="saelens", model_name=get("model_name"),
        metadata={**metadata, "architecture": architecture, "hook_head_index": head},
    )


def _check_values(fields: dict, where: str) -> None:
    """Each field read has its type (see BOOLS ... OBJECTS), naming the first that does not."""
    for name, value in fields.items():
        if name in BOOLS and not (name == "finetuning_scaling_factor" and value is None):
            as_bool(value, name, where)
        elif name in STRINGS:
            as_str(value, name, where)
        elif name in SIZES:
            as_int(value, name, where)
        elif name in HEADS:
            as_index(value, name, where)
        elif name in OBJECTS:
            as_dict(value, name, where)
        elif name == "dtype":
            as_choice(value, DTYPES, name, where)


def _legacy_architecture(cfg: dict, where: str) -> str:
    """Before SAELens 6: the architecture follows from activation_fn(_str) (SAELens's handle_pre_6_0_config)."""
    fn = cfg.get("activation_fn") or cfg.get("activation_fn_str") or "relu"
    if fn == "topk" and (cfg.get("activation_fn_kwargs") or {}).get("k") is not None:
        cfg["k"] = as_int(cfg["activation_fn_kwargs"]["k"], "activation_fn_kwargs.k", where)
        return "topk"
    if fn != "relu":
        raise ResidError(f"{where}: activation_fn {fn!r} is not one resid computes (relu, topk).")
    return "standard"


def _refuse_unsupported(cfg: dict, where: str) -> None:
    if cfg.get("rescale_acts_by_decoder_norm") and cfg.get("architecture", "topk") != "topk":
        raise ResidError(f"{where}: rescale_acts_by_decoder_norm=True is a setting of SAELens's TopK SAEs, but "
                         f"architecture is {cfg['architecture']!r}; set it to false (SAELens ignores it there) or "
                         "fix the architecture.")
    if cfg.get("finetuning_scaling_factor"):
        raise ResidError(f"{where}: finetuning_scaling_factor=True (an old SAELens fine-tuning scale) is not "
                         "computed by resid; re-save the SAE with a current SAELens.")
    if cfg.get("reshape_activations", "none") not in ("none", "hook_z"):
        raise ResidError(f"{where}: reshape_activations={cfg['reshape_activations']!r}; resid reads 'none' and "
                         "'hook_z' (heads flattened).")


def _normalization(cfg: dict, where: str) -> str:
    value = cfg.get("normalize_activations", "none")
    if value is None or value is False:
        return "none"
    if value is True:  # SAELens < 6 wrote a bool for the expected-average scaling
        return "expected_average_only_in"
    if value not in ("none", "constant_norm_rescale", "layer_norm", "expected_average_only_in"):
        raise ResidError(f"{where}: normalize_activations={value!r} is not one resid computes (none, "
                         "constant_norm_rescale, layer_norm, expected_average_only_in); SAELens folds "
                         "covariance_whitening into the weights when training ends: save the final SAE.")
    return value


def _tensors(path: Path, activation: str, skip: bool) -> dict[str, torch.Tensor]:
    tensors = read_safetensors(path)
    if "scaling_factor" in tensors:
        if not torch.all(tensors["scaling_factor"] == 1):
            raise ResidError(f"{path}: scaling_factor is not all ones (an old SAELens fine-tuning scale resid does "
                             "not compute); re-save the SAE with a current SAELens.")
        del tensors["scaling_factor"]
    if "log_threshold" in tensors:  # older JumpReLU checkpoints (SAELens converts them the same way)
        tensors["threshold"] = tensors.pop("log_threshold").exp()
    known = {"W_enc": True, "W_dec": True, "b_dec": True}
    known.update({"b_gate": True, "b_mag": True, "r_mag": True} if activation == "gated" else {"b_enc": True})
    if activation == "jumprelu":
        known["threshold"] = True
    if skip:
        known["W_skip"] = True
    return take(tensors, known, str(path))


def _fold_scaling_factor(found: dict, factor: float | None, where: str) -> dict:
    if factor is None:
        raise ResidError(f"{where}: normalize_activations='expected_average_only_in' scales inputs by a factor that "
                         "SAELens keeps in its registry, not in this folder; pass it: "
                         "resid.dictionaries.load(path, norm_scaling_factor=...) (SAELens's norm_scaling_factor).")
    folded = dict(found)  # as SAELens's fold_activation_norm_scaling_factor
    folded["W_enc"] = found["W_enc"] * factor
    folded["W_dec"] = found["W_dec"] / factor
    folded["b_dec"] = found["b_dec"] / factor
    return folded


def _fold_decoder_norms(found: dict, path: Path) -> dict:
    """rescale_acts_by_decoder_norm folded as SAELens's fold_W_dec_norm (_fold_norm_topk): the top k of
    (x @ W_enc + b_enc) * |W_dec row| is the top k of x @ (W_enc * norm) + b_enc * norm, and the activations
    divided by the norm times W_dec are the activations times W_dec / norm."""
    norms = found["W_dec"].norm(dim=-1)  # [d_sae], in the file's dtype as SAELens computes it
    if bool((norms == 0).any()):
        dead = (norms == 0).nonzero().flatten().tolist()
        raise ResidError(f"{path}: rescale_acts_by_decoder_norm=True, but W_dec rows {dead[:10]} are zero, so "
                         "SAELens's decode divides by a zero norm (NaN reconstructions); drop those features or "
                         "give them a decoder direction.")
    folded = dict(found)
    folded["W_enc"] = found["W_enc"] * norms
    folded["b_enc"] = found["b_enc"] * norms
    folded["W_dec"] = found["W_dec"] / norms[:, None]
    return folded


def write(dictionary: Dictionary | CrossLayerTranscoder, folder: Path) -> Path:
    """Save `dictionary` as a SAELens 6 folder (cfg.json + sae_weights.safetensors) that SAELens's
    SAE.load_from_disk reads back to the same encode and decode. Returns the folder."""
    if not isinstance(dictionary, Dictionary):
        raise ResidError(f"SAELens's format holds one SAE or transcoder (a resid.dictionaries.Dictionary), not a "
                         f"{type(dictionary).__name__}.")
    architecture = _architecture_of(dictionary)
    tensors = {"W_enc": dictionary.W_enc, "W_dec": dictionary.W_dec, "b_dec": dictionary.b_dec}
    for name in ("b_enc", "threshold", "b_gate", "b_mag", "r_mag"):
        if getattr(dictionary, name) is not None:
            tensors[name] = getattr(dictionary, name)
    if dictionary.W_skip is not None:
        tensors["W_skip"] = dictionary.W_skip.T
    finite_to_write(tensors, f"Dictionary {dictionary.name!r}")
    folder = folder_to_write(folder, f"a SAELens dictionary ({CONFIG} and {WEIGHTS})")
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(folder / WEIGHTS))
    mask = os.umask(0o022)  # safetensors makes the file 0600: give it the user's umask, as cfg.json has (read by
    os.umask(mask)          # setting it, and set straight back)
    os.chmod(folder / WEIGHTS, 0o666 & ~mask)
    metadata = {k: v for k, v in dictionary.metadata.items() if k not in ("architecture",)}
    # SAELens 6's layout: without a version SAELens would read the file as a pre-6 one
    metadata.update(model_name=dictionary.model_name, sae_lens_version="6.0.0",
                    sae_lens_training_version=metadata.get("sae_lens_training_version", "6.0.0"))
    hooks = [("hook_name", dictionary.hook_in)] + ([("hook_name_out", dictionary.hook_out)]
                                                   if dictionary.is_transcoder else [])
    for key, hook in hooks:  # Hugging Face module paths go where SAELens keeps them (hf_hook_name)
        tensorlens = hook is None or hook.startswith(("blocks.", "hook_"))
        metadata[key if tensorlens else key.replace("hook_name", "hf_hook_name")] = hook
    cfg = {"architecture": architecture, "d_in": dictionary.d_in, "d_sae": dictionary.d_sae,
           "dtype": str(dictionary.W_enc.dtype).removeprefix("torch."), "device": "cpu",
           "apply_b_dec_to_input": dictionary.apply_b_dec_to_input,
           "normalize_activations": dictionary.normalize_activations,
           "reshape_activations": "hook_z" if (dictionary.hook_in or "").endswith("attn.hook_z") else "none",
           "metadata": metadata}
    if architecture == "topk":
        cfg.update(k=dictionary.k, rescale_acts_by_decoder_norm=False)
    if dictionary.is_transcoder:
        cfg["d_out"] = dictionary.d_out
    (folder / CONFIG).write_text(json.dumps(cfg, indent=1))
    return folder


def _architecture_of(d: Dictionary) -> str:
    where = f"Dictionary {d.name!r} cannot be written in SAELens format"
    if d.W_skip is not None and not d.is_transcoder:
        raise ResidError(f"{where}: it is an SAE with a skip path, which SAELens has no architecture for.")
    if d.activation == "jumprelu" and bool((d.threshold < 0).any()):
        raise ResidError(f"{where}: it has negative thresholds (pre * (pre > t) lets negative pre-activations "
                         "through), but SAELens's JumpReLU applies relu first.")
    if d.is_transcoder:
        if d.activation not in ("relu", "jumprelu") or d.apply_b_dec_to_input:
            raise ResidError(f"{where}: SAELens transcoders are relu or jumprelu and never subtract b_dec from the "
                             f"input (this one: activation={d.activation!r}, "
                             f"apply_b_dec_to_input={d.apply_b_dec_to_input}).")
        base = "transcoder" if d.activation == "relu" else "jumprelu_transcoder"
        return base.replace("transcoder", "skip_transcoder") if d.W_skip is not None else base
    return {"relu": "standard", "jumprelu": "jumprelu", "topk": "topk", "gated": "gated"}[d.activation]
