"""A crash-safe, resumable result store for long sweeps (ablation sweeps write thousands of rows over hours).

Kill the process at any moment and run the same command again: `done()` names the rows already stored, the
sweep skips them, and `finish()` writes every row exactly once.

Glossary:
    out        the final file, `*.parquet` or `*.csv`; written only by `finish()`.
    chunk      one `write()`, stored as `<out>.parts/chunk-NNNNNN-<writer>.<suffix>` (same format as out), in write
               order; <writer> is random per store, so no two stores can ever write one chunk name.
    key        the tuple of a row's `key_columns` values, in that order; it names the row across runs.
    signature  a JSON dict describing the sweep (model, prompts hash, method, ...); resuming needs an equal one.

Beside the chunks, `<out>.parts/` holds signature.json (signature, key columns; written before the first chunk)
and schema.json (columns, text columns; written before any chunk that changes it). After `finish()` the sidecar
`<out>.sweep.json` holds all of these for `out`, and the parts folder is gone. Every file is written atomically
(`resid.analyses.io.atomic`): a kill leaves the old file or the new one, never a torn one. Leftover `.tmp-*` files are
never read and are deleted when a store is opened. A file that holds a key twice (`out` or one chunk: ResultStore
never writes one) is refused when the store is opened, naming the key and what to delete. Chunks are deleted
only after `out` and its sidecar are on disk.

Chunks and `out` are encoded by `resid.analyses.io.frames`, the codec `tables` uses; text columns are those whose
values are strings in some chunk (whatever their dtype there). Dtypes of the frame `finish()` returns: int columns
stay int64, float columns float64, string columns `str`. A key column of whole numbers with missing values
(`head`, None for an MLP row) becomes nullable Int64, whatever mix of int / float / None the chunks held. Parquet
keeps every other dtype; CSV reads numbers back as int64 / float64 (floats are exact, -0.0 included), and in CSV
an empty string reads back as missing (a table's sidecar lists its missing cells; chunks keep no such list).
The DataFrame index is not stored.

One writer per `out`: a store holds an exclusive lock on `<out>.lock` (resid.analyses.io.lock) from its
construction until `finish()` or `close()` (or its process ends, however it ends); a second process opening a store
of the same `out` meanwhile gets a ResidError naming the holder's pid. A store is also a context manager (`close()`
on exit). The finished sidecar records the resid version that wrote it.
"""

import json
import os
import re
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

import resid
from resid.analyses.io import atomic, frames, suffixes
from resid.analyses.io.lock import Holder, OutputLock
from resid.errors import ResidError

SUFFIXES = suffixes.STORE
_CHUNK = re.compile(r"^chunk-(\d+)(?:-[0-9a-f]+)?(\.parquet|\.csv)$")  # chunks of older stores have no writer part


def _write_json(path: Path, data: dict) -> None:
    atomic.write(path, json.dumps(data, sort_keys=True, indent=1))


def _read_json(path: Path, fields: tuple[str, ...], remedy: str) -> dict:
    """One of the store's JSON files, with the `fields` it must have; a damaged one is an error naming it."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        problem = f"is not readable JSON ({error})"
    else:
        missing = [name for name in fields if name not in found] if isinstance(found, dict) else list(fields)
        if not missing:
            return found
        problem = f"lacks {missing}" if isinstance(found, dict) else f"holds a JSON {type(found).__name__}"
    raise ResidError(f"{path} {problem}: it was edited or damaged, so the results beside it cannot be trusted. "
                     f"{remedy}")


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _keys(frame: pd.DataFrame) -> set[tuple]:
    """The keys of a frame of key columns, as plain Python values (frames.key_value)."""
    columns = [frame[name].tolist() for name in frame.columns]
    return {tuple(frames.key_value(value) for value in row) for row in zip(*columns)}


class ResultStore(Holder):
    """Rows of one sweep, persisted chunk by chunk and merged into `out` by `finish()`; see the module docstring."""

    def __init__(self, out: str | os.PathLike, key_columns: Sequence[str], signature: dict[str, object]):
        self.out = Path(out)
        self.suffix = self.out.suffix.lower()
        if self.suffix not in SUFFIXES:
            raise ResidError(
                f"ResultStore cannot write {str(self.out)!r}: the output path must end in one of "
                f"{', '.join(SUFFIXES)}, which also picks the format of the chunks. Rename the output path."
            )
        if isinstance(key_columns, str) or not key_columns or len(set(key_columns)) != len(key_columns):
            raise ResidError(
                f"ResultStore needs key_columns as a non-empty list of distinct column names, got {key_columns!r}. "
                "Pass the columns that together name one result row, e.g. ['prompt', 'layer', 'component', 'head']."
            )
        self.key_columns = tuple(key_columns)
        try:  # compare the JSON form, since that is what a later run reads back (tuples become lists, ...)
            self.signature = json.loads(json.dumps(signature, sort_keys=True))
        except (TypeError, ValueError) as error:
            raise ResidError(
                f"The ResultStore signature must be JSON-serializable ({error}). Describe the sweep with plain "
                "strings, numbers, lists and dicts (e.g. a hash of the prompts instead of the prompts tensor)."
            ) from error
        self.parts = Path(f"{self.out}.parts")
        self.sidecar = Path(f"{self.out}.sweep.json")
        self._next_chunk: int | None = None
        self._done: set[tuple] | None = None  # done()'s keys, read once by the check on opening; a write clears it
        self._writer = uuid.uuid4().hex[:12]
        self._lock = OutputLock(Path(f"{self.out}.lock"), self.out)
        self._hold()

    def _open(self) -> None:
        for leftover in [*self.out.parent.glob(f"{atomic.TMP_PREFIX}{self.out.name}-*"),
                         *self.parts.glob(f"{atomic.TMP_PREFIX}*")]:
            leftover.unlink(missing_ok=True)  # a write killed before its os.replace; never part of the results
        if (self.parts / "signature.json").exists():
            self._check_signature(self.parts / "signature.json", f"the unfinished chunks in {self.parts}",
                                  f"Delete {self.parts} to compute its rows again.")
        elif self._chunks():
            raise ResidError(
                f"{self.parts} holds result chunks but no signature.json, so ResultStore cannot tell which sweep "
                f"they belong to. Delete {self.parts} (or move it away) or choose another output path."
            )
        # A sidecar without `out` is stale (the user deleted the results) and is simply overwritten by finish().
        if self.out.exists():
            if not self.sidecar.exists():
                raise ResidError(
                    f"{self.out} exists but has no {self.sidecar.name} beside it, so it was not written by "
                    "ResultStore (or the sidecar was deleted) and may hold results of a different sweep. Delete "
                    f"{self.out} or choose another output path."
                )
            self._check_signature(self.sidecar, str(self.out), self._start_over)
        self._check_unique()

    @property
    def _start_over(self) -> str:
        return (f"Delete {self.out} and {self.sidecar.name} to compute the results again, or restore them from a "
                "copy.")

    def _check_unique(self) -> None:
        """Refuse a file that holds a key twice. ResultStore never writes one (write refuses a chunk that repeats
        a key, finish merges each key once), so such a file was edited or damaged, and using it would keep the
        repeats (a finished `out` is returned as stored: every mean over it changes) or drop rows unseen. Across
        files a key may repeat (a chunk written again after a crash before its bookkeeping): finish keeps the
        first. The keys read here are done()'s answer, so opening a store and asking what is done reads the key
        columns once."""
        keys = set()
        for path, frame in self._files(columns=list(self.key_columns)):
            repeated = frame[frame.duplicated(keep=False)]
            if repeated.empty:
                keys |= _keys(frame)
                continue
            first = tuple(frames.key_value(value) for value in repeated.iloc[0])
            remedy = (self._start_over + " Or remove the repeated rows, keeping one of each." if path == self.out
                      else f"Delete {path.name} from {self.parts}: its rows are computed again on the next run.")
            raise ResidError(
                f"{path} holds {len(repeated)} rows of {len(repeated.drop_duplicates())} repeated key(s) "
                f"{list(self.key_columns)}, e.g. {first}. ResultStore writes each key once per file, so the file was "
                f"edited or damaged; resuming it would keep the repeats and change every mean over them. {remedy}"
            )
        self._done = keys

    def _hold(self) -> None:
        """Every method reads or writes under the lock. Taking it (again, after finish() or close()) checks the
        files afresh, since another writer may have changed them meanwhile."""
        if self._lock.superseded:
            raise ResidError(
                f"This ResultStore of {self.out} was superseded by a newer store of the same output in this process, "
                "which now holds its lock; use the newer store."
            )
        if self._lock.held:
            return
        self._lock.acquire()  # before reading anything: another writer's files are not ours to judge or clean
        self._next_chunk = self._done = None
        try:
            self._open()
        except BaseException:
            self._lock.release()
            raise

    def rows(self) -> pd.DataFrame:
        """Every row stored so far (a finished `out`, then the chunks), as `finish()` would merge them, without
        writing anything: for a resumed sweep to check them against its job before computing the rest."""
        self._hold()
        text = self._schema()[1]
        if self.out.exists():
            text = text | set(self._stored()["text_columns"])
        pieces = list(self._frames())
        if not pieces:
            return pd.DataFrame(columns=list(self.key_columns))
        return self._normalise(pd.concat(pieces, ignore_index=True), text)

    def mismatch(self, problem: str) -> ResidError:
        """The error for stored rows that this sweep could not have written: `problem` says which, this says what
        to do."""
        return ResidError(f"The results stored at {self.out} do not match this sweep: {problem}. Delete {self.out}, "
                          f"{self.sidecar.name} and {self.parts.name} (whichever exist) to compute them again, or "
                          "choose another output path.")

    def done(self) -> set[tuple]:
        """Keys of the rows in complete chunks and in a finished `out`; a missing value (NaN, NA) reads as None."""
        self._hold()
        if self._done is None:
            self._done = set().union(*(_keys(frame) for frame in self._frames(columns=list(self.key_columns))))
        return set(self._done)

    def write(self, rows: pd.DataFrame) -> None:
        """Persist one chunk: after this returns, the rows survive a kill. An empty frame writes nothing."""
        if rows.empty:
            return
        self._hold()
        if not all(isinstance(name, str) for name in rows.columns):
            raise ResidError(f"ResultStore.write needs string column names, got {list(rows.columns)!r}.")
        missing = [name for name in self.key_columns if name not in rows.columns]
        if missing:
            raise ResidError(
                f"ResultStore.write got rows without the key column(s) {missing}; every chunk needs all of "
                f"{list(self.key_columns)} so that resuming can tell which rows are done."
            )
        repeated = rows.duplicated(subset=list(self.key_columns))
        if repeated.any():
            first = tuple(frames.key_value(value) for value in rows.loc[repeated, list(self.key_columns)].iloc[0])
            raise ResidError(
                f"ResultStore.write got {int(repeated.sum())} row(s) whose key repeats within the chunk, e.g. "
                f"{first}; keys {list(self.key_columns)} must name one row each. Add the column that tells these "
                "rows apart to key_columns."
            )
        self.parts.mkdir(parents=True, exist_ok=True)
        if not (self.parts / "signature.json").exists():
            _write_json(self.parts / "signature.json", {"signature": self.signature, "key_columns": self.key_columns})
        columns, text = self._schema()
        if columns is None and self.out.exists():  # resuming after finish: new rows must match `out`
            columns = self._stored()["columns"]
        if columns is None:
            columns = list(rows.columns)
        elif set(columns) != set(rows.columns):
            raise ResidError(
                f"ResultStore.write got columns {sorted(rows.columns)} but this sweep's earlier rows have "
                f"{sorted(columns)}; every chunk of one sweep needs the same columns (missing: "
                f"{sorted(set(columns) - set(rows.columns))}, extra: {sorted(set(rows.columns) - set(columns))})."
            )
        new_text = text | {name for name in rows.columns if frames.shows_text(rows[name])}
        if not (self.parts / "schema.json").exists() or new_text != text:
            # Before the chunk, so no chunk on disk has a text column the schema does not know.
            _write_json(self.parts / "schema.json", {"columns": columns, "text_columns": sorted(new_text)})
        if self._next_chunk is None:
            self._next_chunk = max((index + 1 for index, _ in self._chunks()), default=0)
        path = self.parts / f"chunk-{self._next_chunk:06d}-{self._writer}{self.suffix}"
        frame = rows.reset_index(drop=True)[columns]
        frames.write(frame, path)
        self._next_chunk += 1
        self._done = None  # read back from the files when asked: CSV reads "" as missing

    def finish(self) -> pd.DataFrame:
        """Merge `out` (if any) and all chunks, in order and each key once, into `out`; return the merged frame.

        With no chunks this returns `out` as stored, or, if nothing was ever written, an empty frame with only
        the key columns (and writes no file). Releases the lock.
        """
        self._hold()
        try:
            return self._finish()
        finally:
            self._lock.release()

    def _finish(self) -> pd.DataFrame:
        chunks = self._chunks()
        if not chunks:
            frame = self._read_out() if self.out.exists() else pd.DataFrame(columns=list(self.key_columns))
            shutil.rmtree(self.parts, ignore_errors=True)  # only metadata and temporaries: nothing to lose
            return frame
        columns, text = self._schema()
        if self.out.exists():
            stored = self._stored()
            columns, text = stored["columns"], text | set(stored["text_columns"])
        pieces = list(self._frames())
        merged = self._normalise(pd.concat(pieces, ignore_index=True), text)
        merged = merged.drop_duplicates(subset=list(self.key_columns), keep="first").reset_index(drop=True)
        merged = merged[columns]
        # Sidecar first: a kill between the two leaves a sidecar of this sweep beside the old `out` (or none),
        # which the next run accepts, and the chunks are still there to be merged again.
        sidecar = {"signature": self.signature, "key_columns": self.key_columns, "columns": columns}
        _write_json(self.sidecar, {**sidecar, "text_columns": sorted(text), "resid_version": resid.__version__})
        frames.write(merged, self.out)
        shutil.rmtree(self.parts)
        self._next_chunk = None
        return merged

    def _check_signature(self, path: Path, holder: str, remedy: str) -> None:
        stored = _read_json(path, ("signature", "key_columns"), remedy)
        if not isinstance(stored["signature"], dict):
            raise ResidError(f"{path} holds a signature that is not a JSON object: it was edited or damaged. "
                             f"{remedy}")
        # Different key columns make done() compare other tuples: as much a different sweep as another model.
        old = {**stored["signature"], "(key_columns)": stored["key_columns"]}
        new = {**self.signature, "(key_columns)": list(self.key_columns)}
        differ = [name for name in sorted(set(old) | set(new)) if old.get(name, ...) != new.get(name, ...)]
        if differ:
            shown = "; ".join(
                f"{name!r}: stored {old.get(name, '<absent>')!r:.80}, now {new.get(name, '<absent>')!r:.80}"
                for name in differ
            )
            raise ResidError(
                f"{self.out} holds results of a different sweep: {holder} were written with a signature that "
                f"differs in {shown}. Delete {self.out}, {self.sidecar.name} and {self.parts.name} to start over, "
                "or choose another output path."
            )

    def _chunks(self) -> list[tuple[int, Path]]:
        if not self.parts.is_dir():
            return []
        found = [(_CHUNK.match(path.name), path) for path in self.parts.iterdir()]
        return sorted((int(match[1]), path) for match, path in found if match and match[2] == self.suffix)

    def _schema(self) -> tuple[list[str] | None, set[str]]:
        path = self.parts / "schema.json"
        if not path.exists():
            return None, set()
        schema = _read_json(path, ("columns", "text_columns"), f"Delete {self.parts} to compute its rows again.")
        return schema["columns"], set(schema["text_columns"])

    def _frames(self, columns: list[str] | None = None):
        """`out` (when it exists; the constructor checked its sidecar) then every chunk, in write order."""
        for _, frame in self._files(columns):
            yield frame

    def _files(self, columns: list[str] | None = None):
        """(path, frame) of `out` and every chunk, as `_frames`."""
        if self.out.exists():
            yield self.out, self._read_out(columns)
        names, text = self._schema()
        chunks = self._chunks()
        if chunks and names is None:
            raise ResidError(f"{self.parts} holds result chunks but no schema.json (written before the first "
                             f"chunk), so it was edited or damaged. Delete {self.parts} to compute its rows again.")
        for _, path in chunks:
            yield path, self._read(path, names, text, columns)

    def _stored(self) -> dict:
        """The finished sidecar (the constructor checked its signature)."""
        return _read_json(self.sidecar, ("columns", "text_columns"), self._start_over)

    def _read_out(self, columns: list[str] | None = None) -> pd.DataFrame:
        stored = self._stored()
        text = set(stored["text_columns"])
        return self._normalise(self._read(self.out, stored["columns"], text, columns), text)

    def _read(self, path: Path, names: list[str], text: set[str], columns: list[str] | None) -> pd.DataFrame:
        # Chunks of one sweep disagree on the dtypes of other columns; _normalise settles those after merging.
        schema = [{"name": name, "dtype": frames.TEXT_DTYPE if name in text else None} for name in names]
        frame = frames.read(path, schema, columns)
        for name in sorted(set(frame.columns) - text):  # numbers (or missing) only: ResultStore wrote no text there
            found = [value for value in frame[name].tolist() if isinstance(value, str)]
            if found:
                shown = next((value for value in found if not _number(value)), found[0])
                raise self.mismatch(f"{path} holds text ({shown!r:.40}) in its column {name!r}, where this sweep "
                                    "stores numbers (the file was edited or damaged)")
        if self.suffix == ".csv":
            # In CSV a missing text cell and "" are the same empty field, and chunks keep no list of missing
            # cells (a table's sidecar does): both read as missing.
            for name in text & set(frame.columns):
                frame[name] = frame[name].mask(frame[name] == "")
        return frame

    def _normalise(self, frame: pd.DataFrame, text: set[str]) -> pd.DataFrame:
        # Chunks disagree on dtypes (a chunk of MLP rows has head all None, one of heads has int64); settle them
        # once on the merged frame so every run and both formats give the same dtypes.
        frame = frame.copy()
        for name in frame.columns:
            if name in text:
                frame[name] = frame[name].astype(frames.TEXT_DTYPE)
            elif name in self.key_columns and frames.is_optional_int(frame[name]):
                frame[name] = frame[name].astype("Int64")
        return frame
