"""Lenses on disk: tuned lenses in two layouts, J-lenses in two; `read` takes any of them, `write` writes any.

J-lenses (resid.analyses.lenses.JacobianLens):
    resid's (`layout="resid"`): FOLDER/jacobians.safetensors, the tensor `jacobians` [site d_model d_model] float32
    (J_s[i, j] = E d h_final[i] / d h_s[j]) and in its metadata: format "resid.jacobian_lens", version "1", sites (a
    JSON list of resid.Site labels), info (JSON: the model, the windows, skip_first, ...).
    the reference's (`layout="transformer-lens"`): one .pt file as Anthropic's reference implementation and
    TransformerLens 4.3's JacobianLens.save write it, and as Neuronpedia publishes the fitted lenses:
    {"J": {layer: [d_model d_model]} (fp16 in published files), "n_prompts", "source_layers", "d_model", optional
    "metadata"}, layer l being the output of block l (resid_post); the reference's fit checkpoints ({"jacobian_sum":
    {layer: sum over prompts}, "n_done", ...}) are read too, as TransformerLens reads them (sum / n_done). A .pt is a
    pickle: resid reads it with torch.load(weights_only=True), which builds tensors and plain containers only.

Tuned lenses:

resid's own (`layout="resid"`): one file, FOLDER/translators.safetensors, holding
    weight  [site d_model d_model] float32     (T(h) = h + h @ weight[s].T + bias[s], as torch.nn.Linear)
    bias    [site d_model] float32             (absent for translators without a bias)
and in the safetensors metadata: format "resid.tuned_lens", version "1", every ("layer" | "sublayer"), sites (a
JSON list of resid.Site labels, ["layers[0].resid_pre", "layers[0].resid_post", ...]), unembed_hash and info (JSON:
the model, the training recipe, tokens seen). Files written before resid.Site (metadata "level", sites spelled
"resid_post 0") are read too.

tuned-lens's (`layout="tuned-lens"`, what `TunedLens.save` writes and the lenses it publishes use): FOLDER/config.json
    {"base_model_name_or_path", "d_model", "num_hidden_layers", "bias", "base_model_revision", "unembed_hash",
     "lens_type": "linear_tuned_lens"}
and FOLDER/params.pt, the state dict of its `layer_translators` (a ModuleList of nn.Linear): "0.weight", "0.bias",
... one per layer input (translators.tuned_lens_sites). params.pt is a pickle: resid reads it with
`torch.load(weights_only=True)`, which unpickles tensors and plain containers only and refuses any other object,
so a params.pt can never run code here. Unknown config keys are refused by name.

Reading refuses what would be silently wrong or exhaust memory, naming the file and the field or tensor: config
fields of the wrong type (bias is a JSON boolean, sizes whole numbers of at least 1), a params.pt whose entry count
differs from what config.json declares (counted before anything is built from num_hidden_layers), non-float or
non-finite translator values (the translator's site is named), and damaged or truncated files.

`unembed_hash` is tuned-lens's fingerprint of the unembedding matrix (utils.tensor_hash): the sha256 of numpy's
summary print of W_U [d_vocab d_model] at one decimal (only its corner values, so it survives a dtype change but
not other weights). A lens whose hash differs from the model's was trained on other weights: an error, unless
check_unembedding=False (on the command line, --skip-unembedding-check).
"""

import hashlib
import json
import pickle
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from resid.analyses.io import atomic
from resid.analyses.lenses.lens import JacobianLens, Lens, TunedLens
from resid.analyses.lenses.translators import Translators, translator_site, tuned_lens_sites
from resid.errors import ResidError, param
from resid.finite import all_finite
from resid.model import Transformer
from resid.sites import Site

Layout = Literal["resid", "tuned-lens", "transformer-lens"]
RESID_FILE = "translators.safetensors"
FORMAT, VERSION = "resid.tuned_lens", "1"
JLENS_FILE, JLENS_FORMAT = "jacobians.safetensors", "resid.jacobian_lens"
JLENS_PT = "jacobian_lens.pt"  # the name `write(layout="transformer-lens")` gives the reference's file
TUNED_LENS_CONFIG, TUNED_LENS_PARAMS = "config.json", "params.pt"
TUNED_LENS_KEYS = ("base_model_name_or_path", "d_model", "num_hidden_layers", "bias", "base_model_revision",
                   "unembed_hash", "lens_type")
# numpy's default print options, spelled out: the hash is of a printout, which global options would change.
_PRINT = dict(precision=1, threshold=1000, edgeitems=3, linewidth=75, suppress=False, floatmode="maxprec",
              sign="-", nanstr="nan", infstr="inf", legacy=False)


def unembed_hash(model: Transformer) -> str:
    """tuned-lens's unembed_hash of this model's unembedding (see the module docstring)."""
    weight = model.readout.unembed.weight.detach().cpu().float().numpy()  # [d_vocab d_model], as nn.Linear
    with np.printoptions(**_PRINT):
        return hashlib.sha256(str.encode(np.array_str(weight))).hexdigest()


def read(model: Transformer, path: str | Path, check_unembedding: bool = True) -> TunedLens | JacobianLens:
    """The lens in `path` for `model`: a J-lens (a folder with jacobians.safetensors, or the reference's .pt file) or
    a tuned lens (a folder in either layout, or a .safetensors file)."""
    path = Path(path)
    if is_jacobian(path):
        return read_jacobian(model, path)
    return lens_for(model, read_translators(path), check_unembedding, str(path))


def is_jacobian(path: Path) -> bool:
    """Whether `path` holds a J-lens (by its file names and, for a lone .safetensors file, its format tag)."""
    if path.is_file() and path.suffix == ".pt" or (path / JLENS_FILE).is_file():
        return True
    if path.is_file() and path.suffix == ".safetensors":
        try:
            with safe_open(str(path), framework="pt") as handle:
                return (handle.metadata() or {}).get("format") == JLENS_FORMAT
        except (SafetensorError, OSError):
            return False
    return False


def read_jacobian(model: Transformer, path: str | Path) -> JacobianLens:
    """The J-lens in `path` (resid's folder or .safetensors file, or the reference's .pt) for `model`."""
    path = Path(path)
    if path.is_file() and path.suffix == ".pt":
        sites, jacobians, info = _read_reference_jlens(path)
    else:
        sites, jacobians, info = _read_resid_jlens(path if path.is_file() else path / JLENS_FILE)
    d = model.config.d_model
    if jacobians.shape[1:] != (d, d):
        raise ResidError(f"The J-lens in {path} is {jacobians.shape[1]} wide but {model.name} has d_model={d}: it was "
                         "fitted for another model.")
    return JacobianLens(model, sites, jacobians, info)


def lens_for(
    model: Transformer, translators: Translators, check_unembedding: bool = True, where: str = ""
) -> TunedLens:
    """The tuned lens of `model` with these translators, after comparing the unembedding they were trained on
    (tuned-lens's unembed_hash, when they record one) with the model's."""
    expected = translators.info.get("unembed_hash")
    if check_unembedding and expected and expected != unembed_hash(model):
        raise ResidError(
            f"The lens{' in ' + where if where else ''} was trained on another unembedding than {model.name}'s "
            f"(unembed_hash {expected[:12]}... vs {unembed_hash(model)[:12]}...): it belongs to other weights. Pass "
            f"{param('check_unembedding', False)} to read it anyway (e.g. a lens trained on the unquantized model)."
        )
    return TunedLens(model, translators)


def read_translators(path: str | Path) -> Translators:
    """The translators in `path`, without a model (shapes checked, nothing else)."""
    path = Path(path)
    if path.is_file() and path.suffix == ".safetensors":
        return _read_resid(path)
    if (path / RESID_FILE).is_file():
        return _read_resid(path / RESID_FILE)
    if (path / TUNED_LENS_CONFIG).is_file() and (path / TUNED_LENS_PARAMS).is_file():
        return _read_tuned_lens(path)
    raise ResidError(
        f"No tuned lens in {path}: expected a folder with {RESID_FILE} (resid's layout) or with {TUNED_LENS_CONFIG} "
        f"and {TUNED_LENS_PARAMS} (tuned-lens's), or a .safetensors file. Train one with `resid lens train`."
    )


def write(lens: Lens | Translators, folder: str | Path, layout: Layout = "resid") -> Path:
    """Writes the lens into `folder` (created if needed), each file atomically; returns the folder. A J-lens in
    resid's layout or the reference's (layout="transformer-lens": FOLDER/jacobian_lens.pt), a tuned lens in resid's
    or tuned-lens's (layout="tuned-lens")."""
    if isinstance(lens, JacobianLens):
        return _write_jacobian(lens, Path(folder), layout)
    if not isinstance(lens, TunedLens | Translators):
        raise ResidError(f"write takes a TunedLens, its Translators or a JacobianLens, not a {type(lens).__name__} "
                         "(the logit lens has nothing to write).")
    translators = lens.translators if isinstance(lens, TunedLens) else lens
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    weight = translators.weight.detach().float().cpu().contiguous()
    bias = None if translators.bias is None else translators.bias.detach().float().cpu().contiguous()
    if layout == "resid":
        tensors = {"weight": weight} if bias is None else {"weight": weight, "bias": bias}
        info = {k: v for k, v in translators.info.items() if k != "unembed_hash"}
        metadata = {"format": FORMAT, "version": VERSION, "every": translators.every,
                    "sites": json.dumps([s.label for s in translators.sites]),
                    "unembed_hash": translators.info.get("unembed_hash", ""), "info": json.dumps(info)}
        atomic.write(folder / RESID_FILE, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))
        return folder
    if layout != "tuned-lens":
        raise ResidError(f"{param('layout', layout)} is not a layout of a tuned lens: use 'resid' or 'tuned-lens'.")
    n_layers = len(translators.sites)
    if translators.sites != tuned_lens_sites(n_layers):
        raise ResidError(f"tuned-lens's layout holds one translator per layer input ({param('every', 'layer')}); "
                         f"these translators are at {[s.label for s in translators.sites]}. Write them with "
                         f"{param('layout', 'resid')}.")
    state = {}
    for i in range(n_layers):
        state[f"{i}.weight"] = weight[i].clone()
        if bias is not None:
            state[f"{i}.bias"] = bias[i].clone()
    config = {"base_model_name_or_path": translators.info.get("model", ""), "d_model": translators.d_model,
              "num_hidden_layers": n_layers, "bias": bias is not None, "base_model_revision": None,
              "unembed_hash": translators.info.get("unembed_hash") or None, "lens_type": "linear_tuned_lens"}
    atomic.write(folder / TUNED_LENS_PARAMS, lambda tmp: torch.save(state, tmp))
    atomic.write(folder / TUNED_LENS_CONFIG, json.dumps(config))
    return folder


def _read_resid(file: Path) -> Translators:
    try:
        with safe_open(str(file), framework="pt") as handle:
            metadata = handle.metadata() or {}
            if metadata.get("format") != FORMAT or metadata.get("version") != VERSION:
                raise ResidError(f"{file} is not a resid tuned lens (format {metadata.get('format')!r} version "
                                 f"{metadata.get('version')!r}; expected {FORMAT!r} version {VERSION}).")
            names = set(handle.keys())
            if not {"weight"} <= names <= {"weight", "bias"}:
                raise ResidError(f"{file} holds tensors {sorted(names)}; a resid tuned lens holds 'weight' and "
                                 "'bias'.")
            for name in names:
                if handle.get_slice(name).get_dtype() != "F32":
                    raise ResidError(f"Tensor {name!r} in {file} has dtype {handle.get_slice(name).get_dtype()}; "
                                     "resid writes translators as float32 (F32). The file is damaged or was not "
                                     "written by resid; re-train or re-export it.")
            tensors = {name: handle.get_tensor(name) for name in names}
    except (SafetensorError, OSError) as err:
        raise ResidError(f"{file} is not a readable safetensors file ({err}); it may be truncated: re-train or "
                         "re-copy it.") from None
    if "sites" not in metadata:
        raise ResidError(f"{file} names no sites in its metadata: it was not written by resid.analyses.lenses.formats.")
    labels = _json_field(metadata["sites"], "sites", file, list)
    if not all(isinstance(label, str) for label in labels):
        raise ResidError(f"{file}: metadata sites must be a list of site labels, got {labels!r}.")
    sites = tuple(translator_site(label) for label in labels)
    info = _json_field(metadata.get("info", "{}"), "info", file, dict)
    if metadata.get("unembed_hash"):
        info["unembed_hash"] = metadata["unembed_hash"]
    every = metadata.get("every", metadata.get("level", "layer"))  # "level": files written before every=
    if tensors["weight"].ndim != 3 or len(sites) != tensors["weight"].shape[0]:
        raise ResidError(f"{file}: weight has shape {list(tensors['weight'].shape)} for {len(sites)} sites; a resid "
                         "tuned lens holds weight [site d_model d_model]. The file is damaged; re-train it.")
    _finite({name: tensors[name] for name in sorted(tensors, reverse=True)}, file, sites)
    return Translators(sites, tensors["weight"], tensors.get("bias"), every, info)


def _json_field(text: str, field: str, file: Path, kind: type) -> list | dict:
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        raise ResidError(f"{file}: metadata {field} is not readable JSON ({type(err).__name__}); the file is damaged: "
                         "re-train or re-copy it.") from None
    if not isinstance(value, kind):
        raise ResidError(f"{file}: metadata {field} holds a JSON {type(value).__name__}, not a {kind.__name__}; the "
                         "file is damaged: re-train or re-copy it.")
    return value


def _finite(tensors: dict[str, torch.Tensor], file: Path, sites: tuple, numbered: bool = False) -> None:
    """Refuse NaN or infinite translator values ([site ...] tensors), naming the tensor as the file does (`numbered`:
    tuned-lens's "3.weight") and its site: a lens with one would print NaN probabilities (and a rank-1 token picked
    from NaNs)."""
    for name, tensor in tensors.items():
        if all_finite(tensor):
            continue
        bad = ~torch.isfinite(tensor)
        if bool(bad.any()):
            i = int(bad.reshape(len(sites), -1).any(1).nonzero()[0])
            raise ResidError(f"Tensor {f'{i}.{name}' if numbered else name!r} in {file} (the translator at "
                             f"{sites[i].label}) holds {int(bad.sum()):,} non-finite value(s) (NaN or infinite): the "
                             "lens would print NaN probabilities. The file is damaged or training diverged; re-train "
                             "or re-download it.")


def _read_tuned_lens(folder: Path) -> Translators:
    path = folder / TUNED_LENS_CONFIG
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ResidError(f"{path} is not valid UTF-8 JSON ({error}); re-download or re-export it.") from None
    except RecursionError:
        raise ResidError(f"{path} nests JSON too deeply to be a lens config; re-download or re-export it.") from None
    if not isinstance(config, dict):
        raise ResidError(f"{path} holds a JSON {type(config).__name__}, not the object of fields a tuned-lens config "
                         "is; re-download or re-export it.")
    unknown = sorted(set(config) - set(TUNED_LENS_KEYS))
    if unknown:
        raise ResidError(f"{path} has keys resid does not know: {unknown} (it knows "
                         f"{list(TUNED_LENS_KEYS)}); this is not a lens layout resid reads.")
    _check_config(config, path)
    if config.get("lens_type", "linear_tuned_lens") != "linear_tuned_lens":
        raise ResidError(f"{folder} holds a {config['lens_type']!r} lens; resid reads tuned-lens's "
                         "'linear_tuned_lens' only.")
    n_layers, d_model, has_bias = config["num_hidden_layers"], config["d_model"], config.get("bias", True)
    try:
        state = torch.load(folder / TUNED_LENS_PARAMS, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ResidError(
            f"{folder / TUNED_LENS_PARAMS} holds objects other than tensors, which resid never unpickles (it reads "
            "params.pt with torch.load(weights_only=True)): it is not a tuned-lens lens, or it was tampered with."
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as error:
        raise ResidError(f"{folder / TUNED_LENS_PARAMS} is not a readable torch file ({error}).") from None
    parts = ("weight", "bias") if has_bias else ("weight",)
    # counted before the names are built: a config claiming 10^9 layers must not build 2*10^9 strings
    if not isinstance(state, dict) or len(state) != n_layers * len(parts):
        found = f"{len(state)} entries" if isinstance(state, dict) else f"a {type(state).__name__}"
        raise ResidError(f"{folder / TUNED_LENS_PARAMS} should hold {n_layers * len(parts):,} tensors for "
                         f"{n_layers:,} layers ({', '.join(parts)} per layer, as {path.name} says), found {found}.")
    expected = {f"{i}.{part}" for i in range(n_layers) for part in parts}
    if set(state) != expected:
        raise ResidError(f"{folder / TUNED_LENS_PARAMS} should hold {sorted(expected)[:4]}... ({len(expected)} "
                         f"tensors for {n_layers} layers), found {sorted(map(str, state))[:8]}.")
    shapes = {name: tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for name, t in state.items()
              if not isinstance(t, torch.Tensor) or not t.is_floating_point()
              or t.shape != ((d_model, d_model) if name.endswith("weight") else (d_model,))}
    if shapes:
        raise ResidError(f"{folder / TUNED_LENS_PARAMS} has tensors of the wrong shape or dtype for d_model={d_model} "
                         f"(float [d_model d_model] weights, [d_model] biases): {dict(list(shapes.items())[:4])}.")
    sites = tuned_lens_sites(n_layers)
    weight = torch.stack([state[f"{i}.weight"].float() for i in range(n_layers)])
    bias = torch.stack([state[f"{i}.bias"].float() for i in range(n_layers)]) if has_bias else None
    _finite({"weight": weight} if bias is None else {"weight": weight, "bias": bias}, folder / TUNED_LENS_PARAMS,
            sites, numbered=True)
    info = {"model": config.get("base_model_name_or_path"), "source": "tuned-lens"}
    if config.get("unembed_hash"):
        info["unembed_hash"] = config["unembed_hash"]
    return Translators(sites, weight, bias, "layer", info)


def _check_config(config: dict, path: Path) -> None:
    """tuned-lens's fields have their types: sizes are positive whole numbers, bias a JSON boolean (the string
    "false" would read as true), the rest strings or null."""
    problems = []
    for name in ("d_model", "num_hidden_layers"):
        value = config.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(f"{name} must be a whole number of at least 1, written without quotes or a decimal "
                            f"point, but it is {value!r}")
    if not isinstance(config.get("bias", True), bool):
        problems.append(f"bias must be a boolean (true or false, without quotes), but it is {config['bias']!r}")
    for name in ("base_model_name_or_path", "base_model_revision", "unembed_hash", "lens_type"):
        if config.get(name) is not None and not isinstance(config[name], str):
            problems.append(f"{name} must be a string or null, but it is {config[name]!r}")
    if problems:
        raise ResidError(f"{path}: " + "; ".join(problems) + ". Fix the file (tuned-lens writes these types).")


def _write_jacobian(lens: JacobianLens, folder: Path, layout: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    jacobians = lens.jacobians.detach().float().cpu().contiguous()
    if layout == "resid":
        metadata = {"format": JLENS_FORMAT, "version": VERSION, "sites": json.dumps([s.label for s in lens.sites]),
                    "info": json.dumps(lens.info)}
        atomic.write(folder / JLENS_FILE, lambda tmp: save_file({"jacobians": jacobians}, str(tmp), metadata=metadata))
        return folder
    if layout != "transformer-lens":
        raise ResidError(f"{param('layout', layout)} is not a layout of a J-lens: use 'resid' or 'transformer-lens' "
                         "(the reference implementation's .pt file).")
    blocks = [s for s in lens.sites if s.part == "resid_post"]
    if len(blocks) != len(lens.sites):
        others = [s.label for s in lens.sites if s.part != "resid_post"]
        raise ResidError(f"The reference's J-lens file holds block outputs (resid_post) only; this lens also has "
                         f"{others}. Write it with {param('layout', 'resid')}, or fit it at resid_post sites.")
    layers = [s.layer for s in lens.sites]
    payload = {"J": {layer: jacobians[i].clone() for i, layer in enumerate(layers)},
               "n_prompts": int(lens.info.get("windows", 0)), "source_layers": sorted(layers),
               "d_model": int(jacobians.shape[1]),
               "metadata": {k: v for k, v in lens.info.items() if isinstance(v, str | int | float | bool)}}
    atomic.write(folder / JLENS_PT, lambda tmp: torch.save(payload, tmp))
    return folder


def _read_resid_jlens(file: Path) -> tuple[tuple[Site, ...], torch.Tensor, dict]:
    try:
        with safe_open(str(file), framework="pt") as handle:
            metadata = handle.metadata() or {}
            if metadata.get("format") != JLENS_FORMAT or metadata.get("version") != VERSION:
                raise ResidError(f"{file} is not a resid J-lens (format {metadata.get('format')!r} version "
                                 f"{metadata.get('version')!r}; expected {JLENS_FORMAT!r} version {VERSION}).")
            if set(handle.keys()) != {"jacobians"} or handle.get_slice("jacobians").get_dtype() != "F32":
                raise ResidError(f"{file} should hold one float32 tensor 'jacobians'; it holds {sorted(handle.keys())}."
                                 " The file is damaged or was not written by resid.")
            jacobians = handle.get_tensor("jacobians")
    except (SafetensorError, OSError) as err:
        raise ResidError(f"{file} is not a readable safetensors file ({err}); it may be truncated: re-fit or "
                         "re-copy it.") from None
    labels = _json_field(metadata.get("sites", ""), "sites", file, list)
    if not all(isinstance(label, str) for label in labels):
        raise ResidError(f"{file}: metadata sites must be a list of site labels, got {labels!r}.")
    sites = tuple(Site.parse(label) for label in labels)
    if jacobians.ndim != 3 or len(jacobians) != len(sites) or jacobians.shape[1] != jacobians.shape[2]:
        raise ResidError(f"{file}: jacobians has shape {list(jacobians.shape)} for {len(sites)} sites; a J-lens holds "
                         "[site d_model d_model]. The file is damaged; re-fit it.")
    _finite({"jacobians": jacobians}, file, sites)
    return sites, jacobians, _json_field(metadata.get("info", "{}"), "info", file, dict)


def _read_reference_jlens(file: Path) -> tuple[tuple[Site, ...], torch.Tensor, dict]:
    """The reference implementation's artifact (or fit checkpoint), as TransformerLens 4.3's JacobianLens.load reads
    it: {"J": {layer: matrix}, "n_prompts", "d_model", ...}, or {"jacobian_sum": {layer: sum}, "n_done", ...}."""
    try:
        payload = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ResidError(f"{file} holds objects other than tensors and plain containers, which resid never unpickles "
                         "(it reads .pt files with torch.load(weights_only=True)): it is not a J-lens file, or it was "
                         "tampered with.") from None
    except (RuntimeError, EOFError, OSError, ValueError) as error:
        raise ResidError(f"{file} is not a readable torch file ({error}).") from None
    if not isinstance(payload, dict) or not ({"J", "jacobian_sum"} & set(payload)):
        found = sorted(map(str, payload))[:8] if isinstance(payload, dict) else type(payload).__name__
        raise ResidError(f"{file} is not a J-lens: the reference's files hold 'J' (a lens) or 'jacobian_sum' (a fit "
                         f"checkpoint), found {found}.")
    checkpoint = "J" not in payload
    matrices = payload["jacobian_sum" if checkpoint else "J"]
    if not isinstance(matrices, dict) or not matrices:
        raise ResidError(f"{file}: {'jacobian_sum' if checkpoint else 'J'} should map layers to matrices, found "
                         f"{type(matrices).__name__}.")
    layers = sorted(matrices)
    if not all(isinstance(layer, int) and not isinstance(layer, bool) and layer >= 0 for layer in layers):
        raise ResidError(f"{file}: the layers of its matrices should be whole numbers, found {layers[:8]}.")
    first = matrices[layers[0]]
    square = (first.shape[0],) * 2 if isinstance(first, torch.Tensor) and first.ndim == 2 else None
    bad = [layer for layer in layers if not isinstance(matrices[layer], torch.Tensor)
           or not matrices[layer].is_floating_point() or tuple(matrices[layer].shape) != square]
    if bad:
        raise ResidError(f"{file}: the matrices of layers {bad[:8]} are not float [d_model d_model] like the others.")
    jacobians = torch.stack([matrices[layer].float() for layer in layers])
    info = {k: v for k, v in (payload.get("metadata") or {}).items() if isinstance(v, str | int | float | bool)}
    if checkpoint:
        done = payload.get("n_done")
        if isinstance(done, bool) or not isinstance(done, int) or done < 1:
            raise ResidError(f"{file} is a J-lens fit checkpoint whose n_done is {done!r}, not a positive count of "
                             "prompts: it cannot be averaged.")
        jacobians, info["windows"] = jacobians / done, done
    else:
        d_model = payload.get("d_model")
        if d_model is not None and d_model != jacobians.shape[1]:
            raise ResidError(f"{file}: d_model is {d_model} but its matrices are {jacobians.shape[1]} wide: the file "
                             "is damaged.")
        if isinstance(payload.get("n_prompts"), int):
            info["windows"] = payload["n_prompts"]
    sites = tuple(Site(layer, "resid_post") for layer in layers)
    _finite({"J": jacobians}, file, sites)
    return sites, jacobians, {**info, "source": "reference J-lens file", "file": file.name}
