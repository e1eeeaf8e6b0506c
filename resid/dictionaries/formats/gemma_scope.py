"""Gemma Scope 2 (`config.json` + `params.safetensors`) and Gemma Scope 1 (`params.npz`, no config).

Tensors, in the Gemma Scope layout (x @ w_enc, no transposes):

    w_enc [d_in d_sae]   w_dec [d_sae d_out]   b_enc [d_sae]   b_dec [d_out]   threshold [d_sae]
    affine_skip_connection [d_in d_out]        (Gemma Scope 2 transcoders with affine_connection: + x @ it)

Gemma Scope 1's params.npz names them W_enc / W_dec (capital W) or w_enc / w_dec; resid reads it without pickle
(resid.dictionaries.formats.read_npz: an .npz of plain arrays needs none). Both apply JumpReLU as
relu(pre) * (pre > threshold) and never subtract b_dec from the input.

config.json fields (Gemma Scope 2): architecture ("jump_relu"), model_name, hf_hook_point_in, hf_hook_point_out
(Hugging Face module paths, resid.dictionaries.hooks), type ("sae" | "transcoder"), affine_connection, width, l0.
"""

import math
import numbers
from pathlib import Path

from resid.dictionaries.dictionary import ActivationFunction, Binding, Dictionary, Weights
from resid.dictionaries.formats import (
    as_bool,
    as_choice,
    as_int,
    as_str,
    check_dictionary_fields,
    clamp_threshold,
    read_json,
    read_npz,
    read_safetensors,
    take,
)
from resid.errors import ResidError

CONFIG, WEIGHTS, NPZ = "config.json", "params.safetensors", "params.npz"
READ = frozenset({"architecture", "model_name", "hf_hook_point_in", "hf_hook_point_out", "type",
                  "affine_connection"})
PROVENANCE = frozenset({"width", "l0"})  # d_sae and the target sparsity: checked against the tensors / recorded


def read(folder: Path) -> Dictionary:
    """A Gemma Scope 2 folder (config.json + params.safetensors), or a Gemma Scope 1 folder (params.npz)."""
    if (folder / WEIGHTS).exists():
        return _read_v2(folder)
    if (folder / NPZ).exists():
        return _read_v1(folder)
    raise ResidError(f"{folder} has neither {WEIGHTS} (Gemma Scope 2) nor {NPZ} (Gemma Scope 1).")


def _read_v2(folder: Path) -> Dictionary:
    where = str(folder / CONFIG)
    cfg = read_json(folder / CONFIG)
    check_dictionary_fields(cfg, READ | PROVENANCE, where, "a Gemma Scope 2 dictionary")
    as_choice(cfg.get("architecture", "jump_relu"), ("jump_relu",), "architecture", where)
    kind = cfg.get("type", "sae")
    if kind not in ("sae", "transcoder"):
        raise ResidError(f"{where}: type {kind!r} is not 'sae' or 'transcoder' (cross-layer transcoders are read "
                         "through their circuit-tracer config.yaml).")
    affine = as_bool(cfg.get("affine_connection", False), "affine_connection", where)
    for name in ("model_name", "hf_hook_point_in", "hf_hook_point_out"):
        as_str(cfg.get(name), name, where)
    if "width" in cfg:
        as_int(cfg["width"], "width", where)
    l0 = cfg.get("l0")
    if l0 is not None and (isinstance(l0, bool) or not isinstance(l0, numbers.Real) or not math.isfinite(l0) or l0 < 0):
        raise ResidError(f"{where}: l0 must be null or a finite number of at least 0, but it is {l0!r}. Fix that "
                         "field of the file.")
    known = {"w_enc": True, "w_dec": True, "b_enc": True, "b_dec": True, "threshold": True,
             "affine_skip_connection": affine}
    found = take(read_safetensors(folder / WEIGHTS), known, str(folder / WEIGHTS))
    if "width" in cfg and cfg["width"] != found["w_enc"].shape[-1]:
        raise ResidError(f"{where}: width={cfg['width']} but w_enc has {found['w_enc'].shape[-1]} features.")
    hook_in = cfg.get("hf_hook_point_in")
    hook_out = cfg.get("hf_hook_point_out") if kind == "transcoder" else hook_in
    return _dictionary(found, folder, "gemma_scope_2", hook_in, hook_out, cfg.get("model_name"),
                       {"l0": cfg.get("l0"), "type": kind}, transcoder=kind == "transcoder")


def _read_v1(folder: Path) -> Dictionary:
    arrays = read_npz(folder / NPZ)
    lower = {name[0].lower() + name[1:]: value for name, value in arrays.items()}  # W_enc -> w_enc
    known = {"w_enc": True, "w_dec": True, "b_enc": True, "b_dec": True, "threshold": True}
    found = take(lower, known, str(folder / NPZ))
    return _dictionary(found, folder, "gemma_scope_1", None, None, None, {})


def _dictionary(found: dict, folder: Path, fmt: str, hook_in: str | None, hook_out: str | None,
                model_name: str | None, metadata: dict, transcoder: bool | None = None) -> Dictionary:
    skip = found.get("affine_skip_connection")
    return Dictionary(
        Weights(found["w_enc"], found["w_dec"], found["b_dec"], found["b_enc"], skip),
        ActivationFunction("jumprelu", clamp_threshold(found["threshold"])),
        binding=Binding(hook_in, hook_out, transcoder=transcoder), name=folder.name, format=fmt,
        model_name=model_name, metadata=metadata,
    )
