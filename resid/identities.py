"""A model's identity: what every number it computes depends on, as one JSON-able record used by provenance
sidecars, resumable result stores and remote workers alike.

    name      what resid.load was given (a resid name, a folder, a .gguf file, a Hub id), for people to read
    weights   sha256 over every parameter's name, shape, dtype and bytes, in the model's order: the weights as
              they are now, so a model edited in place (folded, ablated, `W.data.mul_(2)`) or loaded from a
              replaced file of the same name has another identity
    dtype     the parameters' dtype
    config    sha256 of the ModelConfig's fields

Two models with equal `weights` and `config` compute the same numbers on the same device (the name and the
files they came from do not enter). Hashing reads every weight once: about 0.3 s for SmolLM2-135M on a CPU.

Result stores and workers hash every time (a long job can afford it, and resuming from another model's numbers is
the silent wrong answer this guards against). Provenance, recorded by every analysis call, asks for
`identity(model, reuse=True)`: the last identity of this model, unless a parameter was replaced, moved, edited in
place through torch (its version counter) or differs at any of a fixed sample of its elements (edits through
`.data`, which version counters do not see); then it hashes again.
"""

import dataclasses
import hashlib
import json
import weakref

import torch
from torch import nn


@dataclasses.dataclass(frozen=True)
class Identity:
    name: str
    weights: str  # sha256 hex of the parameters
    dtype: str
    config: str  # sha256 hex of the config

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)

    def same_numbers(self, other: "Identity") -> bool:
        """Whether the two models compute the same numbers (equal weights, dtype and config; names may differ)."""
        return (self.weights, self.dtype, self.config) == (other.weights, other.dtype, other.config)


_LAST: "weakref.WeakKeyDictionary[nn.Module, tuple[tuple, torch.Tensor, Identity]]" = weakref.WeakKeyDictionary()
SAMPLE = 64  # elements per parameter compared before an identity is reused


def identity(model: nn.Module, *, reuse: bool = False) -> Identity:
    """The identity of a resid Transformer or EncoderDecoder as its parameters are now. reuse: return the last
    identity computed for this model when nothing seen since says its weights changed (see the module's text)."""
    key, sample = _state(model)
    last = _LAST.get(model)
    if reuse and last is not None and last[0] == key and torch.equal(last[1], sample):
        return last[2]
    found = _hash(model)
    _LAST[model] = (key, sample, found)
    return found


def _state(model: nn.Module) -> tuple[tuple, torch.Tensor]:
    """What identifies the parameters' storage and edits cheaply: per parameter its name, address, version counter,
    shape, dtype and device; and the values at SAMPLE fixed positions spread over it (as float64, concatenated)."""
    key, samples = [getattr(model, "name", "custom"), config_digest(model)], {}
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            key.append((name, parameter.data_ptr(), parameter._version, tuple(parameter.shape), parameter.dtype,
                        parameter.device))
            flat = parameter.detach().reshape(-1)
            if flat.numel():
                k = min(SAMPLE, flat.numel())  # k positions from the first to the last, in integers
                where = torch.arange(k, device=flat.device) * (flat.numel() - 1) // max(k - 1, 1)
                picked = flat[where]
                samples.setdefault(flat.device, []).append(picked if picked.dtype == torch.float64 else picked.float())
    # one move to the host per device, not one per parameter (each is a synchronisation on a GPU: a 30-layer model's
    # ~280 of them made every provenance record, and so every analysis call, wait on the device that many times)
    moved = [torch.cat(group).cpu().double() for group in samples.values()]
    return tuple(key), torch.cat(moved) if moved else torch.zeros(0, dtype=torch.float64)


def _hash(model: nn.Module) -> Identity:
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            data = parameter.detach().contiguous().cpu()
            digest.update(f"{name} {tuple(data.shape)} {data.dtype};".encode())
            digest.update(data.reshape(-1).view(torch.uint8).numpy().data)  # reshape first: 0-d scalars (xIELU)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return Identity(getattr(model, "name", "custom"), digest.hexdigest(), dtype, config_digest(model))


def config_digest(model: nn.Module) -> str:
    """sha256 of the config's fields (of both halves, for an encoder-decoder model)."""
    halves = [model.encoder, model.decoder] if hasattr(model, "encoder") else [model]
    fields = [dataclasses.asdict(half.config) for half in halves]
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()
