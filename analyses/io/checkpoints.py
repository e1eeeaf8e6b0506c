"""The resumable state store of stateful jobs (dictionary training, tuned-lens training): the sibling of
resid.analyses.io.store's ResultStore, which keeps the rows of table jobs, for jobs whose progress is a state.

    store = StateStore("runs/sae", "resid.training.checkpoint", "training", settings)   # locks runs/sae.lock
    found = store.load()                    # (tensors, metadata) saved in runs/sae, or None
    store.save(tensors, {"step": "6"})      # runs/sae/checkpoint.safetensors, atomically
    store.close()                           # the lock goes (also when the process ends, however it ends)

Glossary:
    folder     the job's output folder; the state is FOLDER/checkpoint.safetensors
    kind       the format tag in the file's metadata ("resid.training.checkpoint", "resid.tuned_lens.checkpoint"):
               a folder holding another job's checkpoint is refused, not misread
    settings   a JSON dict of everything that determines the run (model, sites, recipe, data fingerprint);
               resuming needs an equal one, as resuming a ResultStore needs an equal signature (or one of `older`:
               the same run's settings as an earlier version of resid wrote them; the next save writes the new ones)
    metadata   the job's own string entries (steps done, where its data stream is), beside `format` and `settings`

checkpoint.safetensors holds the tensors and the metadata (the settings as JSON among it): the format both jobs
wrote before this store, so their existing checkpoints still resume. It is written with resid.analyses.io.atomic, so
a kill leaves the previous checkpoint or the new one, never a torn file. FOLDER/progress.json repeats the metadata
and settings for people (never read).

A checkpoint that cannot be what its job saved is refused with one error naming the file and what is wrong, never
resumed and never a traceback: unreadable (empty, cut short, its header damaged), without its format or settings,
settings that are not JSON, a tensor holding a NaN or an infinity (a dictionary trained on from there is NaN), and,
through `DamagedState` raised by the job's `restore`, a step that is not a count, a missing tensor or one of another
shape or dtype. The remedy is the same for all: delete the file (or choose another folder) and start over.

One writer per folder: a store holds the exclusive lock `<folder>.lock` (resid.analyses.io.lock, the lock the result
store takes) from its construction until close(), so a second process training into the same folder is refused at
once, naming the first one's pid, instead of the two overwriting each other's checkpoints.
"""

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from resid.analyses.io import atomic
from resid.analyses.io.lock import Holder, OutputLock
from resid.errors import ResidError
from resid.finite import all_finite

FILE = "checkpoint.safetensors"
PROGRESS = "progress.json"


class DamagedState(ResidError):
    """What a job's `restore` found wrong with a saved state (a missing tensor, a shape, a step that is not a count);
    the store's error adds the file and the remedy."""


def count(metadata: Mapping[str, str], key: str, most: int | None = None) -> int:
    """The metadata entry `key` as a count 0..most, or a DamagedState naming it."""
    value = metadata.get(key)
    if value is None:
        raise DamagedState(f"its metadata has no {key!r}")
    if not (isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 19):
        raise DamagedState(f"its metadata's {key!r} is {value[:40]!r}, not a count")
    if most is not None and int(value) > most:
        raise DamagedState(f"its metadata's {key!r} is {value}, more than the run's {most}")
    return int(value)


def expect(tensors: Mapping[str, Tensor], name: str, like: Tensor) -> Tensor:
    """The saved tensor `name`, checked to have the shape and dtype of `like` (the job's own), or a DamagedState."""
    if name not in tensors:
        raise DamagedState(f"it has no tensor {name!r}")
    found = tensors[name]
    if found.shape != like.shape or found.dtype != like.dtype:
        raise DamagedState(f"its tensor {name!r} is {found.dtype} {list(found.shape)} where the run has "
                           f"{like.dtype} {list(like.shape)}")
    return found


def saved_settings(folder: str | os.PathLike) -> dict | None:
    """The settings of the checkpoint in `folder`, or None if there is none or it cannot be read: a look for a
    caller choosing defaults that must match a resumed run (the store itself checks everything when it loads)."""
    try:
        with safe_open(str(Path(folder) / FILE), framework="pt") as handle:
            settings = json.loads((handle.metadata() or {})["settings"])
    except Exception:  # noqa: BLE001 - any unreadable file: no defaults from it; load() reports it properly
        return None
    return settings if isinstance(settings, dict) else None


class StateStore(Holder):
    """The checkpoint of one stateful job in `folder`; see the module docstring."""

    def __init__(self, folder: str | os.PathLike, kind: str, what: str, settings: dict, older: Sequence[dict] = ()):
        self.folder, self.kind, self.what = Path(folder), kind, what
        try:  # compare the JSON form, since that is what a later run reads back (tuples become lists, ...)
            self.settings = json.loads(json.dumps(settings, sort_keys=True))
            self.older = [json.loads(json.dumps(o, sort_keys=True)) for o in older]
        except (TypeError, ValueError) as error:
            raise ResidError(f"A checkpoint's settings must be JSON-serializable ({error}).") from error
        self.path = self.folder / FILE
        self._lock = OutputLock(Path(f"{self.folder}.lock"), self.folder)
        self._hold()

    def _hold(self) -> None:
        if self._lock.superseded:
            raise ResidError(f"This checkpoint store of {self.folder} was superseded by a newer one of the same folder "
                             "in this process, which now holds its lock; use the newer one.")
        self._lock.acquire()

    def load(self) -> tuple[dict[str, Tensor], dict[str, str]] | None:
        """(tensors, metadata) of the run saved in the folder, None if there is none; an error if it is another
        job's checkpoint or was saved with other settings."""
        self._hold()
        if not self.path.is_file():
            return None
        try:
            with safe_open(str(self.path), framework="pt") as handle:
                metadata = handle.metadata() or {}
                if metadata.get("format") != self.kind:
                    raise ResidError(f"{self.path} is not a resid {self.what} checkpoint: delete it or choose "
                                     "another folder.")
                tensors = {name: handle.get_tensor(name) for name in handle.keys()}
        except ResidError:
            raise
        except Exception as error:  # noqa: BLE001 - safetensors raises several types for a damaged file
            detail = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
            raise self.damaged(f"it cannot be read as a safetensors file ({detail}): it is empty, cut short or "
                               "its header is damaged") from None
        try:
            saved = json.loads(metadata["settings"])
        except KeyError:
            raise self.damaged("its metadata has no settings") from None
        except ValueError:
            raise self.damaged("its settings are not JSON") from None
        if not isinstance(saved, dict):
            raise self.damaged("its settings are not a JSON object")
        for name, tensor in tensors.items():
            if not all_finite(tensor):
                raise self.damaged(f"its tensor {name!r} holds NaN or infinite values (training from it would give "
                                   "a NaN result)")
        if saved != self.settings and saved not in self.older:
            changed = sorted(k for k in set(saved) | set(self.settings) if saved.get(k) != self.settings.get(k))
            raise ResidError(
                f"The checkpoint in {self.path} is of a run with other settings ({', '.join(changed)} differ), so it "
                "cannot be resumed with these: rerun with the same ones, or delete it (or choose another folder) to "
                "start over."
            )
        return tensors, {k: v for k, v in metadata.items() if k not in ("format", "settings")}

    def damaged(self, detail: str) -> ResidError:
        """The error for a checkpoint in this folder that cannot be resumed: what is wrong, and what to do."""
        return ResidError(f"The {self.what} checkpoint {self.path} cannot be resumed: {detail}. Delete it (or choose "
                          "another folder) to start over (resid writes a checkpoint whole and finite: this one was "
                          "damaged or changed since).")

    def save(self, tensors: dict[str, Tensor], metadata: dict[str, str]) -> Path:
        """Write the state atomically (the previous one stays until the new one is whole); the file's path."""
        self._hold()
        self.folder.mkdir(parents=True, exist_ok=True)
        entries = {"format": self.kind, **metadata}
        stored = {**entries, "settings": json.dumps(self.settings, sort_keys=True)}
        tensors = {name: t.detach().cpu().contiguous() for name, t in tensors.items()}
        atomic.write(self.path, lambda tmp: save_file(tensors, str(tmp), metadata=stored))
        people = {**entries, "settings": self.settings}
        atomic.write(self.folder / PROGRESS, json.dumps(people, indent=1, sort_keys=True))
        return self.path

