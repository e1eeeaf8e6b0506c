"""circuit-tracer transcoder sets: `config.yaml` + per-layer files, per-layer (model_kind: transcoder_set) or
cross-layer (model_kind: cross_layer_transcoder).

config.yaml fields: model_kind, feature_input_hook / feature_output_hook (TransformerLens names inside a block,
e.g. "hook_resid_mid", "ln2.hook_normalized", "mlp.hook_in" -> "mlp.hook_out"), model_name, transcoders (one path
per layer: local, relative to the folder, or hf://repo/path), and the provenance fields scan and revision.

Per-layer files, read by their tensor names (circuit-tracer picks the loader by the repository's name instead):

    circuit-tracer  layer_{l}.safetensors: W_enc [d_sae d_model] (an nn.Linear weight: W_enc.T is resid's),
                    W_dec [d_sae d_model], b_enc, b_dec, activation_function.threshold (JumpReLU) and W_skip
                    [d_model d_model] (+ x @ W_skip.T) when present
    Gemma Scope 2   w_enc [d_model d_sae], w_dec, b_enc, b_dec, threshold, affine_skip_connection [d_in d_out]
    Gemma Scope 1   .npz: W_enc [d_model d_sae], W_dec, b_enc, b_dec, threshold

Cross-layer files: W_enc_{l}.safetensors with W_enc_{l} [d_sae d_model], b_enc_{l}, b_dec_{l} (the bias of
layer l's output) and threshold_{l}; W_dec_{l}.safetensors with W_dec_{l} [d_sae (n_layers - l) d_model].

circuit-tracer's JumpReLU is pre * (pre > threshold), without a relu, so thresholds are kept as they are.

`write(clt, folder)` saves a resid CrossLayerTranscoder in the cross-layer layout above, which `read` reads back.
Its feature_input_hook is the CLT's own (resid trains on "ln2.hook_normalized", the MLP input before the norm's
gain): circuit-tracer 0.5.0's TransformerLens backend reads that hook on every model, its nnsight backend only on
Gemma 2 and 3 (its Llama, Qwen3 and gpt-oss maps name hook_resid_mid, mlp.hook_in, hook_mlp_out, mlp.hook_out).
"""

import os
import re
from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file

from resid.dictionaries import hub
from resid.dictionaries.crosslayer import CrossLayerTranscoder
from resid.dictionaries.dictionary import ActivationFunction, Binding, Dictionary, Weights
from resid.dictionaries.formats import (
    as_str,
    check_dictionary_fields,
    finite_to_write,
    folder_to_write,
    read_npz,
    read_safetensors,
    shown,
    take,
)
from resid.errors import ResidError
from resid.sites.transformerlens import at_layer

CONFIG = "config.yaml"
CONFIG_BYTES = 1 << 20  # a config lists a few fields and a path per layer: a few kB
CLT_FILE = re.compile(r"W_(?:enc|dec)_(\d+)\.safetensors")  # a cross-layer transcoder's per-layer files
READ = frozenset({"model_kind", "feature_input_hook", "feature_output_hook", "model_name", "transcoders"})
PROVENANCE = frozenset({"scan", "revision"})


def read(folder: Path) -> list[Dictionary] | CrossLayerTranscoder:
    """A transcoder set (one Dictionary per layer, layer 0 first) or a cross-layer transcoder."""
    where = str(folder / CONFIG)
    try:
        if (folder / CONFIG).stat().st_size > CONFIG_BYTES:
            raise ResidError(f"{where} is {(folder / CONFIG).stat().st_size:,} bytes, too large to be a transcoder "
                             f"set's config (at most {CONFIG_BYTES:,}); it is not one, or is damaged.")
        cfg = yaml.load((folder / CONFIG).read_text(), Loader=_NoAliases)  # noqa: S506 (a safe loader)
    except FileNotFoundError:
        raise ResidError(f"{folder} has no {CONFIG} (a circuit-tracer transcoder set).") from None
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ResidError(f"{where} is not valid UTF-8 YAML ({err}); re-download or re-export it.") from None
    except RecursionError:
        raise ResidError(f"{where} nests YAML too deeply to be a config; re-download or re-export it.") from None
    except OSError as err:
        raise ResidError(f"{where} cannot be read as a file ({err.strerror}); it must be the set's YAML config."
                         ) from None
    except _NoAliases.Alias as err:
        raise ResidError(f"{where}: {err}. A transcoder set's config is read without aliases, since a few of them "
                         "expand a small file into billions of values; write the value out in full.") from None
    if not isinstance(cfg, dict):
        raise ResidError(f"{where} holds no mapping of fields.")
    check_dictionary_fields(cfg, READ | PROVENANCE, where, "a circuit-tracer transcoder set")
    for field in ("model_kind", "feature_input_hook", "feature_output_hook"):
        if not isinstance(cfg.get(field), str):
            raise ResidError(f"{where} needs {field} (a string); got {shown(cfg.get(field))}.")
    for field in ("model_name", "revision"):
        as_str(cfg.get(field), field, where)
    kind = cfg["model_kind"]
    if kind == "transcoder_set":
        return [_layer(path, layer, cfg, folder) for layer, path in enumerate(_layer_files(cfg, folder, where))]
    if kind == "cross_layer_transcoder":
        if "transcoders" in cfg:
            raise ResidError(f"{where}: a cross-layer transcoder listed per layer (Gemma Scope 2's CLT layout) is "
                             "not read by resid yet; it reads circuit-tracer's W_enc_{l} / W_dec_{l} files.")
        return _cross_layer(folder, cfg)
    raise ResidError(f"{where}: model_kind {shown(kind)} is not 'transcoder_set' or 'cross_layer_transcoder'.")


class _NoAliases(yaml.SafeLoader):
    """YAML without aliases (*name): a config never needs one, and nine anchors of nine aliases each are a 1 kB file
    that expands to 9^9 values wherever it is walked (a "billion laughs"), hanging whatever checks or shows it."""

    class Alias(Exception):
        """An alias met at `line` (1-based)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise self.Alias(f"line {event.start_mark.line + 1} refers to a YAML alias (*{str(event.anchor):.40})")
        return super().compose_node(parent, index)


def _layer_files(cfg: dict, folder: Path, where: str) -> list[Path]:
    listed = cfg.get("transcoders")
    if listed is None:
        found = {int(m[1]): p for p in folder.glob("layer_*.safetensors") if (m := re.fullmatch(r"layer_(\d+)\.\w+",
                                                                                                 p.name))}
        if not found or sorted(found) != list(range(len(found))):
            raise ResidError(f"{folder} needs layer_0.safetensors .. layer_N.safetensors (one per layer); found "
                             f"layers {sorted(found)}.")
        return [found[layer] for layer in range(len(found))]
    if not isinstance(listed, list) or not all(isinstance(p, str) for p in listed) or not listed:
        raise ResidError(f"{where}: transcoders must be a list of file paths, one per layer.")
    return [_hub_file(p) if p.startswith("hf://") else folder / p for p in listed]


def _hub_file(uri: str) -> Path:
    """hf://owner/repo/path/in/repo[?revision=...] downloaded into the Hub cache (needs the network once)."""
    match = re.fullmatch(r"hf://([^/]+/[^/]+)/([^?]+)(?:\?revision=(.+))?", uri)
    if match is None:
        raise ResidError(f"{uri!r} is not an hf://owner/repo/path URI.")
    return hub.file(match[1], match[2], match[3])


def _layer(path: Path, layer: int, cfg: dict, folder: Path) -> Dictionary:
    if not path.exists():
        raise ResidError(f"{path} (layer {layer} of {folder / CONFIG}) does not exist.")
    if path.suffix == ".npz":
        tensors = read_npz(path)
        known = {"W_enc": True, "W_dec": True, "b_enc": True, "b_dec": True, "threshold": True}
        found = take(tensors, known, str(path))  # Gemma Scope 1: W_enc is already [d_model d_sae]
        W_enc, threshold, skip = found["W_enc"], found["threshold"], None
    else:
        tensors = read_safetensors(path)
        if "w_enc" in tensors:  # Gemma Scope 2's layout
            known = {"w_enc": True, "w_dec": True, "b_enc": True, "b_dec": True, "threshold": True,
                     "affine_skip_connection": False}
            found = {k.replace("w_", "W_"): v for k, v in take(tensors, known, str(path)).items()}
            W_enc, threshold, skip = found["W_enc"], found["threshold"], found.get("affine_skip_connection")
        else:
            known = {"W_enc": True, "W_dec": True, "b_enc": True, "b_dec": True,
                     "activation_function.threshold": False, "W_skip": False}
            found = take(tensors, known, str(path))
            W_enc, threshold = found["W_enc"].T.contiguous(), found.get("activation_function.threshold")
            skip = found["W_skip"].T.contiguous() if "W_skip" in found else None
    return Dictionary(
        Weights(W_enc, found["W_dec"], found["b_dec"], found["b_enc"], skip),
        ActivationFunction("jumprelu" if threshold is not None else "relu", threshold),
        binding=Binding(at_layer(layer, cfg["feature_input_hook"]), at_layer(layer, cfg["feature_output_hook"]),
                        transcoder=True),
        name=f"{folder.name}/layer_{layer}", format="circuit_tracer", model_name=cfg.get("model_name"),
        metadata={"layer": layer, "scan": cfg.get("scan")},
    )


def _cross_layer(folder: Path, cfg: dict) -> CrossLayerTranscoder:
    n_layers = len(list(folder.glob("W_enc_*.safetensors")))
    if n_layers == 0:
        raise ResidError(f"{folder} has no W_enc_0.safetensors .. W_enc_N.safetensors (a circuit-tracer CLT).")
    W_enc, b_enc, b_dec, thresholds, W_dec = [], [], [], [], []
    for layer in range(n_layers):
        path = folder / f"W_enc_{layer}.safetensors"
        known = {f"W_enc_{layer}": True, f"b_enc_{layer}": True, f"b_dec_{layer}": True, f"threshold_{layer}": False}
        found = take(read_safetensors(path), known, str(path))
        W_enc.append(found[f"W_enc_{layer}"].T)
        b_enc.append(found[f"b_enc_{layer}"])
        b_dec.append(found[f"b_dec_{layer}"])
        thresholds.append(found.get(f"threshold_{layer}"))
        path = folder / f"W_dec_{layer}.safetensors"
        W_dec.append(take(read_safetensors(path), {f"W_dec_{layer}": True}, str(path))[f"W_dec_{layer}"])
    if len({t is None for t in thresholds}) != 1:
        raise ResidError(f"{folder}: some layers have threshold_{{l}} and others not; a CLT has one activation.")
    for name, per_layer in (("W_enc", W_enc), ("b_enc", b_enc), ("b_dec", b_dec), ("threshold", thresholds)):
        shapes = [None if t is None else list(t.shape) for t in per_layer]
        differ = next((layer for layer, shape in enumerate(shapes) if shape != shapes[0]), None)
        if differ is not None:
            shown = [shapes[0], shapes[differ]]
            if name == "W_enc":  # shown as the file holds it, [feature d_model]
                shown = [shape[::-1] for shape in shown]
            raise ResidError(f"{folder}: {name}_{differ} has shape {shown[1]} but {name}_0 has {shown[0]}; a "
                             "cross-layer transcoder has the same d_sae and d_model at every layer. The files are "
                             "from different transcoders or damaged; re-download them.")
    jump = thresholds[0] is not None
    return CrossLayerTranscoder(
        W_enc=torch.stack(W_enc), b_enc=torch.stack(b_enc), W_dec=W_dec, b_dec=torch.stack(b_dec),
        threshold=torch.stack(thresholds) if jump else None, activation="jumprelu" if jump else "relu",
        name=folder.name, format="circuit_tracer", hook_in=cfg["feature_input_hook"],
        hook_out=cfg["feature_output_hook"], model_name=cfg.get("model_name"), metadata={"scan": cfg.get("scan")},
    )


def write(clt: CrossLayerTranscoder | Dictionary, folder: str | Path) -> Path:
    """Save `clt` as a circuit-tracer cross-layer transcoder (config.yaml, W_enc_{l} and W_dec_{l}.safetensors per
    layer; see the module docstring), which `read` loads back to the same weights and circuit-tracer 0.5.0's own
    load_clt reads, giving the same graph (tests/data/make_clt_reference.py). Returns the folder."""
    if not isinstance(clt, CrossLayerTranscoder):
        raise ResidError(f"circuit-tracer's cross-layer format holds a resid.dictionaries.CrossLayerTranscoder, not "
                         f"a {type(clt).__name__}; save a per-layer dictionary with the SAELens writer.")
    if clt.W_skip is not None or clt.hook_in is None or clt.hook_out is None:
        raise ResidError(f"Cross-layer transcoder {clt.name!r} cannot be saved in circuit-tracer's format: it needs "
                         "hook_in and hook_out (names within a block) and no skip path (W_skip), which the format "
                         "has no file for.")
    take = lambda t: t.detach().cpu().contiguous()  # noqa: E731
    files = {}  # file name -> its tensors, each checked before any file is written
    for layer in range(clt.n_layers):
        files[f"W_enc_{layer}"] = {f"W_enc_{layer}": clt.W_enc[layer].T, f"b_enc_{layer}": clt.b_enc[layer],
                                   f"b_dec_{layer}": clt.b_dec[layer]}
        if clt.threshold is not None:
            files[f"W_enc_{layer}"][f"threshold_{layer}"] = clt.threshold[layer]
        files[f"W_dec_{layer}"] = {f"W_dec_{layer}": clt.W_dec[layer]}
    what = f"Cross-layer transcoder {clt.name!r}"
    for tensors in files.values():
        finite_to_write(tensors, what)
    folder = folder_to_write(folder, f"a circuit-tracer cross-layer transcoder ({CONFIG} and W_enc_{{l}} / "
                             "W_dec_{l}.safetensors)")
    mask = os.umask(0o022)  # safetensors makes files 0600: give them the user's umask (read by setting it, and set
    os.umask(mask)          # straight back)
    for name, tensors in files.items():
        save_file({k: take(v) for k, v in tensors.items()}, str(folder / f"{name}.safetensors"))
        os.chmod(folder / f"{name}.safetensors", 0o666 & ~mask)
    for stale in folder.iterdir():  # a longer CLT written here before: read would take its later layers as this one's
        match = CLT_FILE.fullmatch(stale.name)
        if match and int(match[1]) >= clt.n_layers:
            stale.unlink()
    cfg = {"model_kind": "cross_layer_transcoder", "feature_input_hook": clt.hook_in,
           "feature_output_hook": clt.hook_out, "model_name": clt.model_name, "scan": clt.name}
    (folder / CONFIG).write_text(yaml.safe_dump(cfg))
    return folder
