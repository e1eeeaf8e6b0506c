"""Tuned lenses on disk, in two layouts; `read` takes either, `write` writes either.

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
from safetensors import safe_open
from safetensors.torch import save_file

from resid.analyses.io import atomic
from resid.analyses.lenses.lens import TunedLens
from resid.analyses.lenses.translators import Translators, translator_site, tuned_lens_sites
from resid.errors import ResidError, param
from resid.model import Transformer

Layout = Literal["resid", "tuned-lens"]
RESID_FILE = "translators.safetensors"
FORMAT, VERSION = "resid.tuned_lens", "1"
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


def read(model: Transformer, path: str | Path, check_unembedding: bool = True) -> TunedLens:
    """The tuned lens in `path` (a folder in either layout, or a .safetensors file) for `model`."""
    return lens_for(model, read_translators(path), check_unembedding, str(path))


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


def write(lens: TunedLens | Translators, folder: str | Path, layout: Layout = "resid") -> Path:
    """Writes the lens into `folder` (created if needed), each file atomically; returns the folder."""
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
        raise ResidError(f"{param('layout', layout)} is not a layout: use 'resid' or 'tuned-lens'.")
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
    with safe_open(str(file), framework="pt") as handle:
        metadata = handle.metadata() or {}
        if metadata.get("format") != FORMAT or metadata.get("version") != VERSION:
            raise ResidError(f"{file} is not a resid tuned lens (format {metadata.get('format')!r} version "
                             f"{metadata.get('version')!r}; expected {FORMAT!r} version {VERSION}).")
        names = set(handle.keys())
        if not {"weight"} <= names <= {"weight", "bias"}:
            raise ResidError(f"{file} holds tensors {sorted(names)}; a resid tuned lens holds 'weight' and 'bias'.")
        weight = handle.get_tensor("weight").float()
        bias = handle.get_tensor("bias").float() if "bias" in names else None
    if "sites" not in metadata:
        raise ResidError(f"{file} names no sites in its metadata: it was not written by resid.analyses.lenses.formats.")
    sites = tuple(translator_site(label) for label in json.loads(metadata["sites"]))
    info = json.loads(metadata.get("info", "{}"))
    if metadata.get("unembed_hash"):
        info["unembed_hash"] = metadata["unembed_hash"]
    every = metadata.get("every", metadata.get("level", "layer"))  # "level": files written before every=
    return Translators(sites, weight, bias, every, info)


def _read_tuned_lens(folder: Path) -> Translators:
    try:
        config = json.loads((folder / TUNED_LENS_CONFIG).read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ResidError(f"{folder / TUNED_LENS_CONFIG} is not valid JSON ({error}).") from None
    unknown = sorted(set(config) - set(TUNED_LENS_KEYS))
    if unknown:
        raise ResidError(f"{folder / TUNED_LENS_CONFIG} has keys resid does not know: {unknown} (it knows "
                         f"{list(TUNED_LENS_KEYS)}); this is not a lens layout resid reads.")
    if config.get("lens_type", "linear_tuned_lens") != "linear_tuned_lens":
        raise ResidError(f"{folder} holds a {config['lens_type']!r} lens; resid reads tuned-lens's "
                         "'linear_tuned_lens' only.")
    try:
        n_layers, d_model, has_bias = int(config["num_hidden_layers"]), int(config["d_model"]), config.get("bias", True)
    except (KeyError, TypeError, ValueError):
        raise ResidError(f"{folder / TUNED_LENS_CONFIG} needs integer d_model and num_hidden_layers.") from None
    try:
        state = torch.load(folder / TUNED_LENS_PARAMS, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ResidError(
            f"{folder / TUNED_LENS_PARAMS} holds objects other than tensors, which resid never unpickles (it reads "
            "params.pt with torch.load(weights_only=True)): it is not a tuned-lens lens, or it was tampered with."
        ) from None
    except (RuntimeError, EOFError) as error:
        raise ResidError(f"{folder / TUNED_LENS_PARAMS} is not a readable torch file ({error}).") from None
    expected = {f"{i}.{part}" for i in range(n_layers) for part in (("weight", "bias") if has_bias else ("weight",))}
    if not isinstance(state, dict) or set(state) != expected:
        found = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ResidError(f"{folder / TUNED_LENS_PARAMS} should hold {sorted(expected)[:4]}... ({len(expected)} "
                         f"tensors for {n_layers} layers), found {found}.")
    shapes = {name: tuple(t.shape) for name, t in state.items() if not isinstance(t, torch.Tensor)
              or t.shape != ((d_model, d_model) if name.endswith("weight") else (d_model,))}
    if shapes:
        raise ResidError(f"{folder / TUNED_LENS_PARAMS} has tensors of the wrong shape for d_model={d_model}: "
                         f"{dict(list(shapes.items())[:4])}.")
    weight = torch.stack([state[f"{i}.weight"].float() for i in range(n_layers)])
    bias = torch.stack([state[f"{i}.bias"].float() for i in range(n_layers)]) if has_bias else None
    info = {"model": config.get("base_model_name_or_path"), "source": "tuned-lens"}
    if config.get("unembed_hash"):
        info["unembed_hash"] = config["unembed_hash"]
    return Translators(tuned_lens_sites(n_layers), weight, bias, "layer", info)
