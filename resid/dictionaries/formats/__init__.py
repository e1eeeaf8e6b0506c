"""One module per dictionary format, each with `read(folder)` and an explicit table of the config fields it reads
and the tensors it expects (names, layouts, transposes). What every reader shares is here: reading JSON,
safetensors (never pickle), and refusing config fields and tensors it does not know, by name, as resid's model
loaders do (resid.load.families.check_fields): a new field may change the maths, so it is never skipped silently.
"""

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from resid.errors import ResidError


def read_json(path: Path) -> dict:
    try:
        found = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResidError(f"{path.parent} has no {path.name}.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ResidError(f"{path} is not valid JSON ({err}); re-download or re-export it.") from None
    if not isinstance(found, dict):
        raise ResidError(f"{path} holds a JSON {type(found).__name__}, not the object of fields a config is.")
    return found


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file (on the CPU, in the file's dtype)."""
    if not path.exists():
        raise ResidError(f"{path.parent} has no {path.name}.")
    try:
        with safe_open(str(path), framework="pt") as handle:
            return {name: handle.get_tensor(name) for name in handle.keys()}
    except (SafetensorError, OSError) as err:
        raise ResidError(f"{path} is not a readable safetensors file ({err}); re-download it.") from None


def check_fields(config: dict, known: frozenset[str], where: str, what: str) -> None:
    """Refuse config fields that are not in `known` (read by the reader or known to be provenance)."""
    unknown = sorted(set(config) - known)
    if unknown:
        shown = ", ".join(f"{name}={config[name]!r}" for name in unknown)
        raise ResidError(f"{where} has field(s) resid does not know for {what}: {shown}. They may change how the "
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


def as_int(value: object, field: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ResidError(f"{where}: {field} must be a positive integer, got {value!r}.")
    return value


def clamp_threshold(threshold: torch.Tensor) -> torch.Tensor:
    """Formats that mask relu(pre) (SAELens, Gemma Scope): relu(pre) * (pre > t) == pre * (pre > max(t, 0))."""
    return threshold.clamp(min=0)
