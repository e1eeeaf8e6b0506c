"""Checking a dictionary against the model it is applied to: one clear error naming both sides, never a silently
wrong decomposition.

1. Hooks: the hook(s) the file names map onto sites of this model (resid.dictionaries.hooks.hook_point).
2. Widths: d_in equals the width of the tensor hook_in reads (d_model, n_heads * d_head for z, d_mlp for MLP
   coefficients), and d_out that of hook_out.
3. Model name, when the file says one. Names are compared loosely, so that "google/gemma-2-2b" matches a model
   loaded as "gemma-2-2b" or "/models/gemma-2-2b-it", and "HuggingFaceTB/SmolLM2-135M" matches "smollm2-135m".
   Each name (lower-cased, its last path part) is read as family, version and size: "gemma-2-2b" -> (gemma, 2,
   2b), "smollm2-135m" -> (smollm, 2, 135m), "llama-3.2-1b" -> (llama, 3.2, 1b), "gpt2-small" -> (gpt, 2,
   small), "pythia-70m-deduped" -> (pythia, -, 70m). The names disagree, and loading is refused, when both
   families are known families (FAMILIES) and differ, or when both give a version, or both a size, that differ.
   Suffixes (-it, -instruct, -deduped, -pt) are not compared: base-model dictionaries are routinely applied to
   the tuned model. A name whose family resid does not know (a local folder "tiny_model") is not compared.
4. TransformerLens processing: a SAELens dictionary trained on a processed model (center_writing_weights,
   fold_value_biases in its model_from_pretrained_kwargs) reads other tensors than resid's unprocessed model has.

`check` returns a new value, the checked dictionary: the same weights (shared, not copied) with its hooks mapped
onto this model's sites and the model (name, config) they were checked against (`checked`); the dictionary given
is left as it was. A run checks every dictionary it attaches (`ensure`), which returns a dictionary already checked
against a model of this name and config as it is: a dictionary loaded without a model, or checked against another
one, is never applied to a model it does not fit (which would otherwise be a raw size-mismatch error from inside
the pass, or a wrong site).
"""

import copy
import dataclasses
import re

from resid.config import ModelConfig
from resid.dictionaries.crosslayer import CrossLayerTranscoder
from resid.dictionaries.dictionary import Dictionary
from resid.dictionaries.hooks import HookPoint, hook_point, width
from resid.errors import ResidError
from resid.sites import RESID_PARTS
from resid.sites.transformerlens import at_layer

FAMILIES = ("gpt", "gemma", "llama", "smollm", "qwen", "mistral", "mixtral", "pythia", "phi", "olmo", "bert",
            "opt", "falcon", "deepseek", "tinystories", "minilm")
SIZE_WORDS = ("small", "medium", "large", "xl")


def check(dictionary: Dictionary | CrossLayerTranscoder, model) -> Dictionary | CrossLayerTranscoder:
    """The checked dictionary: `dictionary` checked against `model` (a resid.Transformer), as a new value whose
    hooks are mapped onto the model's sites (point_in / point_out, or points_in / points_out of a cross-layer
    transcoder), sharing its weights. `dictionary` itself is unchanged."""
    config: ModelConfig = model.config
    _check_name(dictionary, getattr(model, "name", None))
    if isinstance(dictionary, CrossLayerTranscoder):
        if dictionary.n_layers != config.n_layers:
            raise ResidError(f"Cross-layer transcoder {dictionary.name!r} spans {dictionary.n_layers} layers, but "
                             f"model {model.name!r} has {config.n_layers}.")
        layers = range(config.n_layers)
        points_in = tuple(_point(dictionary, at_layer(l, dictionary.hook_in), config, None, model, dictionary.d_in,
                                 "d_in") for l in layers)
        points_out = tuple(_point(dictionary, at_layer(l, dictionary.hook_out), config, None, model,
                                  dictionary.d_out, "d_out") for l in layers)
        return dictionary.bound(points_in, points_out, checked_for(model))
    head = dictionary.metadata.get("hook_head_index")
    point_in = _point(dictionary, dictionary.hook_in, config, head, model, dictionary.d_in, "d_in")
    point_out = point_in if not dictionary.is_transcoder else _point(
        dictionary, dictionary.hook_out, config, dictionary.metadata.get("hook_head_index_out"), model,
        dictionary.d_out, "d_out")
    _check_processing(dictionary, (point_in, point_out), config)
    return dictionary.bound(dataclasses.replace(dictionary.binding, point_in=point_in, point_out=point_out,
                                                checked=checked_for(model)))


def checked_for(model) -> tuple:
    """What a check depends on, recorded in the checked dictionary: the model's name and config."""
    return getattr(model, "name", None), model.config


def is_checked(dictionary: Dictionary | CrossLayerTranscoder, model) -> bool:
    """Whether `dictionary` is a checked dictionary of a model with `model`'s name and config."""
    checked = dictionary.checked if isinstance(dictionary, CrossLayerTranscoder) else dictionary.binding.checked
    return checked is not None and checked[0] == getattr(model, "name", None) and checked[1] == model.config


def ensure(dictionary: Dictionary | CrossLayerTranscoder, model) -> Dictionary | CrossLayerTranscoder:
    """`dictionary` if it is checked against a model of this name and config, else `check(dictionary, model)`.
    A dictionary built in code with its points but no hook names is checked by its widths."""
    if is_checked(dictionary, model):
        return dictionary
    if isinstance(dictionary, Dictionary) and dictionary.hook_in is None and dictionary.point_in is not None:
        _check_widths(dictionary, model)
        return dictionary.bound(dataclasses.replace(dictionary.binding, checked=checked_for(model)))
    return check(dictionary, model)


def _check_widths(dictionary: Dictionary, model) -> None:
    points = {"d_in": dictionary.point_in, "d_out": dictionary.point_out or dictionary.point_in}
    for what, point in points.items():
        expected = width(point, model.config)
        if getattr(dictionary, what) != expected:
            raise ResidError(f"Dictionary {dictionary.name!r} has {what}={getattr(dictionary, what)}, but it "
                             f"{'reads' if what == 'd_in' else 'writes'} {point.site.label} of model "
                             f"{model.name!r}, which is {expected} wide: it was made for another model.")


def _point(dictionary, hook: str | None, config: ModelConfig, head: int | None, model, size: int,
           what: str) -> HookPoint:
    where = f"Dictionary {dictionary.name!r} ({dictionary.format})"
    if hook is None:
        raise ResidError(f"{where} does not say which hook it {'reads' if what == 'd_in' else 'writes'} (Gemma Scope "
                         "1 files carry no config): pass it, e.g. resid.dictionaries.load(path, model, "
                         "hook='blocks.3.hook_resid_post').")
    try:
        point = hook_point(hook, config, head)
    except ResidError as err:
        raise ResidError(f"{where} cannot be applied to model {model.name!r}: {err}") from None
    expected = width(point, config)
    if size != expected:
        raise ResidError(f"{where} has {what}={size}, but its hook {hook!r} reads {point.site.label} of model "
                         f"{model.name!r}, which is {expected} wide: the dictionary was trained on another model "
                         "or another hook.")
    return point


def _check_processing(dictionary: Dictionary, points: tuple[HookPoint, ...], config: ModelConfig) -> None:
    """SAELens records how TransformerLens loaded the model it trained on (model_from_pretrained_kwargs). With
    center_writing_weights every write, hence the residual stream, is centred across d_model (LayerNorm models);
    with fold_value_biases z leaves out the value bias. resid's model is unprocessed, like Hugging Face's, so such
    a dictionary would read other tensors than it was trained on."""
    kwargs = dictionary.metadata.get("model_from_pretrained_kwargs") or {}
    hooks = " and ".join(dict.fromkeys(h for h in (dictionary.hook_in, dictionary.hook_out) if h))
    sites = [point.site for point in points]
    centred = kwargs.get("center_writing_weights") and config.norm == "layernorm" and any(
        site.field is None and site.part in (*RESID_PARTS, "embed", "attn", "mlp") for site in sites)
    folded = kwargs.get("fold_value_biases") and any(site.field == "z" for site in sites)
    if centred or folded:
        setting = "center_writing_weights=True" if centred else "fold_value_biases=True"
        raise ResidError(f"Dictionary {dictionary.name!r} was trained on TransformerLens's processed model "
                         f"({setting} in its model_from_pretrained_kwargs), whose {hooks} differ from the unprocessed "
                         "model resid runs (as Hugging Face does); resid does not apply that processing.")


def _check_name(dictionary, model_name: str | None) -> None:
    if dictionary.model_name is None or model_name is None:
        return
    if not same_model(dictionary.model_name, model_name):
        raise ResidError(f"Dictionary {dictionary.name!r} was trained on {dictionary.model_name!r}, but the model is "
                         f"{model_name!r}: a different model (family, version or size), whose activations it does "
                         "not decompose. Load it with the model it was trained on.")


def parse_name(name: str) -> tuple[str | None, str | None, str | None]:
    """(family, version, size) of a model name; see the module docstring."""
    base = re.split(r"[/\\]", name.strip().rstrip("/\\").lower())[-1]
    tokens = re.findall(r"[a-z]+|\d+(?:\.\d+)*[mbk]?", base)
    tokens = [t for i, t in enumerate(tokens) if not (t == "v" and tokens[i + 1:i + 2] and tokens[i + 1][0].isdigit())]
    at = next((i for i, t in enumerate(tokens) if t in FAMILIES), None)  # skip an organisation ("meta-llama-3")
    family = tokens[at] if at is not None else None
    after = tokens[at + 1] if at is not None and at + 1 < len(tokens) else ""
    version = after if re.fullmatch(r"\d+(?:\.\d+)*", after) else None
    size = next((t for t in tokens if re.fullmatch(r"\d+(?:\.\d+)?[mbk]", t) or t in SIZE_WORDS), None)
    return family, version, size


def same_model(a: str, b: str) -> bool:
    """False when two model names clearly name different models (see the module docstring)."""
    (family_a, version_a, size_a), (family_b, version_b, size_b) = parse_name(a), parse_name(b)
    if family_a is None or family_b is None:
        return True
    if family_a != family_b:
        return False
    if version_a and version_b and version_a != version_b:
        return False
    return not (size_a and size_b and size_a != size_b)


def on_device(dictionaries, model) -> tuple:
    """Each dictionary on `model`'s device: itself where it is already there, else a moved copy (the caller's
    objects stay where they are). Jobs that carry dictionaries to a worker (a Ray worker with a GPU gets the
    driver's CPU copies) call this when they set up."""
    return tuple(d if d.W_enc.device == model.device else copy.deepcopy(d).to(model.device) for d in dictionaries)
