"""One module per dictionary format, each with `read(folder)` and an explicit table of the config fields it reads
and the tensors it expects (names, layouts, transposes). What every reader shares is here: reading JSON,
safetensors and .npz (never pickle), refusing config fields and tensors it does not know, by name, as resid's model
loaders do (resid.load.families.check_model_fields): a new field may change the maths, so it is never skipped silently.

Hostile or damaged files are refused before they can compute a wrong number or exhaust memory:

    config values   each field read is type-checked (a boolean is a JSON true/false, never the string "false";
                    a size is a positive whole number, never 48.9; an enum is one of its values)
    tensor dtypes   a floating-point type (an integer tensor is bit patterns, as resid.load.hf refuses them)
    tensor values   finite: one NaN in a weight makes every activation it touches NaN, and a feature table
                    would then rank token ids 0..k as "top tokens" without a word
    .npz sizes      each array's header is read first and its declared size compared with the zip member, so a
                    3 MB file declaring 2*10^9 values is refused before anything is allocated
"""

import json
import math
import numbers
import reprlib
import zipfile
import zlib
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from resid.errors import ResidError
from resid.finite import all_finite

# The dtypes a weight may be stored in (safetensors names, and numpy kinds for .npz): see the module docstring
FLOATS = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")
NPZ_CHUNK = 1 << 24  # bytes read from an .npz member at a time: memory grows with the data present, not declared


def read_json(path: Path) -> dict:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResidError(f"{path.parent} has no {path.name}.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ResidError(f"{path} is not valid UTF-8 JSON ({err}); re-download or re-export it.") from None
    except RecursionError:
        raise ResidError(f"{path} nests JSON too deeply to be a config; re-download or re-export it.") from None
    except OSError as err:  # a directory, unreadable
        raise ResidError(f"{path} cannot be read as a file ({err.strerror}); it must be the config's JSON file."
                         ) from None
    if not isinstance(found, dict):
        raise ResidError(f"{path} holds a JSON {type(found).__name__}, not the object of fields a config is.")
    return found


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file (on the CPU, in the file's dtype), each checked to be a finite float."""
    if not path.is_file():
        raise ResidError(f"{path.parent} has no {path.name}.")
    tensors = {}
    try:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                dtype = handle.get_slice(name).get_dtype()
                if dtype not in FLOATS:
                    raise ResidError(_not_float(name, path, dtype))
                tensors[name] = handle.get_tensor(name)
    except (SafetensorError, OSError) as err:
        raise ResidError(f"{path} is not a readable safetensors file ({err}); it may be truncated: re-download "
                         "it.") from None
    finite(tensors, path)
    return tensors


def read_npz(path: Path) -> dict[str, torch.Tensor]:
    """Every array of an .npz file of plain float arrays (Gemma Scope 1), never unpickled, each array's header
    checked against the file before its data is read."""
    if not path.is_file():
        raise ResidError(f"{path.parent} has no {path.name}.")
    try:
        with zipfile.ZipFile(path) as archive:
            arrays = {member.filename.removesuffix(".npy"): _npz_member(archive, member, path)
                      for member in archive.infolist()}
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError, NotImplementedError) as err:
        raise ResidError(f"{path} is not a readable .npz file ({err}); it may be truncated: re-download it.") from None
    finite(arrays, path)
    return arrays


def _npz_member(archive: zipfile.ZipFile, member: zipfile.ZipInfo, path: Path) -> torch.Tensor:
    name = member.filename.removesuffix(".npy")
    with archive.open(member) as handle:
        version = np.lib.format.read_magic(handle)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        if version not in read_header:
            raise ValueError(f"array {name!r} has .npy version {version}, not 1.0 or 2.0")
        shape, fortran, dtype = read_header[version](handle, max_header_size=10_000)
        if dtype.hasobject:
            raise ResidError(f"Array {name!r} in {path} holds Python objects, which only unpickling could read; "
                             "resid never unpickles. The file is not a Gemma Scope .npz of plain float arrays.")
        if dtype.kind != "f":
            raise ResidError(_not_float(name, path, dtype))
        size = math.prod(shape) * dtype.itemsize
        if size > member.file_size:
            raise ResidError(f"Array {name!r} in {path} declares shape {list(shape)} ({size:,} bytes), but the file "
                             f"holds {member.file_size:,} bytes for it: the header is damaged or the file truncated; "
                             "re-download it.")
        data = bytearray()
        while len(data) < size:
            chunk = handle.read(min(NPZ_CHUNK, size - len(data)))
            if not chunk:
                raise ResidError(f"Array {name!r} in {path} ends after {len(data):,} of its {size:,} bytes: the file "
                                 "is truncated; re-download it.")
            data += chunk
    array = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
    return torch.from_numpy(np.ascontiguousarray(array))


def _not_float(name: str, path: Path, dtype: object) -> str:
    return (f"Tensor {name!r} in {path} has dtype {dtype}, not a floating-point type: its values would be integer "
            "bit patterns read as weights. The file is damaged or its header was edited; re-export or re-download it.")


def finite(tensors: dict[str, torch.Tensor], path: Path | str) -> None:
    """Refuse a tensor holding NaN or infinite values, naming it."""
    for name, tensor in tensors.items():
        if all_finite(tensor):  # a 150 MB SAE is checked in tens of ms (resid.finite)
            continue
        bad = int((~torch.isfinite(tensor)).sum())
        raise ResidError(f"Tensor {name!r} in {path} holds {bad:,} non-finite value(s) (NaN or infinite) of "
                         f"{tensor.numel():,}: every feature activation it touches would be NaN. The file is "
                         "damaged (or was saved after training diverged); re-download or re-train it.")


def finite_to_write(tensors: dict[str, torch.Tensor], what: str) -> None:
    """Refuse to write a tensor holding NaN or infinite values, naming it: every reader (resid's included) would
    refuse the file, or compute NaN activations from it."""
    for name, tensor in tensors.items():
        if not all_finite(tensor):
            bad = int((~torch.isfinite(tensor)).sum())
            raise ResidError(f"{what}: {name} holds {bad:,} non-finite value(s) (NaN or infinite) of "
                             f"{tensor.numel():,}, so it is not written (every activation it touches would be NaN). "
                             "Training diverged or the weights were edited: train it again, e.g. with a lower "
                             "learning rate, or fix the tensor.")


def folder_to_write(folder: str | Path, what: str) -> Path:
    """`folder`, made if missing: a writer's folder of files, never an existing file."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ResidError(f"{folder} is a file, but {what} is written as a folder of files: give a folder path (made "
                         "if missing).")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ResidError(f"Cannot make the folder {folder} to write {what} into ({err.strerror}): a folder above it "
                         "is a file or not writable. Give another folder path.") from None
    return folder


def shown(value: object) -> str:
    """`value` as an error message shows it: its repr, cut short (a hostile file's value may be huge)."""
    return _SHOWN.repr(value)


_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 80
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxtuple, _SHOWN.maxset = 3, 6, 6, 6, 6


def check_dictionary_fields(config: dict, known: frozenset[str], where: str, what: str) -> None:
    """Refuse config fields that are not in `known` (read by the reader or known to be provenance)."""
    unknown = sorted(set(config) - known, key=str)
    if unknown:
        listed = ", ".join(f"{str(name):.80}={shown(config[name])}" for name in unknown[:10])
        listed += f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        raise ResidError(f"{where} has field(s) resid does not know for {what}: {listed}. They may change how the "
                         "dictionary computes, so resid refuses rather than compute a wrong one; if they are "
                         "harmless, please report it (or remove them from the file).")


def take(tensors: dict[str, torch.Tensor], known: dict[str, bool], where: str) -> dict[str, torch.Tensor]:
    """The tensors named in `known` (name -> required), refusing missing required ones and unknown extras."""
    missing = [name for name, required in known.items() if required and name not in tensors]
    unknown = sorted(set(tensors) - set(known))
    if missing or unknown:
        parts = ([f"missing {missing}"] if missing else []) + ([f"unknown {unknown}"] if unknown else [])
        raise ResidError(f"{where}: tensors {'; '.join(parts)}; it holds {sorted(tensors)}. The file is not the "
                         "layout resid reads for this format (or is truncated).")
    return {name: tensors[name] for name in known if name in tensors}


def _kind(value: object) -> str:
    return ("a string" if isinstance(value, str) else "a boolean" if isinstance(value, bool)
            else "null" if value is None else f"a {type(value).__name__}")


def as_int(value: object, field: str, where: str) -> int:
    """A positive whole number (576, not "576", 576.0 or true)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ResidError(f"{where}: {field} must be a positive whole number written without quotes or a decimal "
                         f"point (e.g. 16), but it is {shown(value)} ({_kind(value)}). Fix that field of the file.")
    return int(value)


def as_index(value: object, field: str, where: str) -> int | None:
    """null, or a whole number of at least 0 (a head index)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ResidError(f"{where}: {field} must be null or a whole number of at least 0, but it is {shown(value)} "
                         f"({_kind(value)}). Fix that field of the file.")
    return int(value)


def as_bool(value: object, field: str, where: str) -> bool:
    """A JSON boolean: the string "false" is truthy in Python, so it is refused rather than read as true."""
    if not isinstance(value, bool):
        raise ResidError(f"{where}: {field} must be a boolean (true or false, without quotes), but it is "
                         f"{shown(value)} ({_kind(value)}). Fix that field of the file.")
    return value


def as_str(value: object, field: str, where: str, optional: bool = True) -> str | None:
    """A string (or null where `optional`)."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ResidError(f"{where}: {field} must be a string{' or null' if optional else ''}, but it is {shown(value)} "
                         f"({_kind(value)}). Fix that field of the file.")
    return value


def as_choice(value: object, choices: tuple, field: str, where: str) -> object:
    """One of `choices` (compared by type as well: true is not 1)."""
    if not any(type(value) is type(choice) and value == choice for choice in choices):
        raise ResidError(f"{where}: {field} is {shown(value)}, not one of the values resid reads "
                         f"({', '.join(map(repr, choices))}). Fix that field of the file.")
    return value


def as_dict(value: object, field: str, where: str) -> dict:
    """An object of fields (null reads as empty)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ResidError(f"{where}: {field} must be an object of fields (or null), but it is {shown(value)} "
                         f"({_kind(value)}). Fix that field of the file.")
    return value


def clamp_threshold(threshold: torch.Tensor) -> torch.Tensor:
    """Formats that mask relu(pre) (SAELens, Gemma Scope): relu(pre) * (pre > t) == pre * (pre > max(t, 0))."""
    return threshold.clamp(min=0)
