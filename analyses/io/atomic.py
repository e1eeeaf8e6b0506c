"""The one atomic file write every writer in resid.analyses.io uses (tables, their sidecars, the result store).

A kill or a failed write at any moment leaves the old file or the new one at `path`, never a torn one:
the bytes go to a temporary file `.tmp-<name>-<random>` in the same folder (so `os.replace` is a rename on
one file system), are flushed and fsync'd, the temporary file replaces `path`, and the folder is fsync'd so
that the rename itself is on disk when `write` returns. A temporary file left by a killed process is never
read; readers that own a folder (`ResultStore`) delete `TMP_PREFIX*` files when they open it.

The file gets the permissions any new file of the user gets (0o666 less the umask: 0644 under the usual 022), as
`open(path, "w")` would give it: a writer that makes its temporary file itself (safetensors' save_file, pandas)
already does, but one that writes through a private temporary file (mkstemp's 0600) would otherwise leave weights
and checkpoints readable by their owner alone while the tables beside them are not.
"""

import hashlib
import os
import uuid
from collections.abc import Callable
from pathlib import Path

TMP_PREFIX = ".tmp-"


def _fsync_dir(folder: Path) -> None:
    # os.replace is durable only once the folder's own entry list reaches the disk.
    if os.name == "nt":  # Windows cannot open a folder; there the replace itself is the best available
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    # The umask can only be read by setting it; set it straight back (no file is made in between by this thread).
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write(path: str | os.PathLike, content: bytes | str | Callable[[Path], None], *,
          sha256: bool = False) -> str | None:
    """Atomically make `path` hold `content`: bytes, text (UTF-8, "\\n" line ends kept), or a function that
    writes the temporary file it is given (e.g. `lambda tmp: df.to_parquet(tmp)`). With `sha256=True`,
    returns the hex sha256 of the bytes now in `path`, else None. The folder must exist."""
    path = Path(path)
    tmp = path.parent / f"{TMP_PREFIX}{path.name}-{uuid.uuid4().hex}"
    digest = hashlib.sha256() if sha256 else None
    try:
        if isinstance(content, str):
            content = content.encode("utf-8")
        if isinstance(content, bytes):
            tmp.write_bytes(content)
        else:
            content(tmp)
        with open(tmp, "rb+") as handle:  # "+": Windows flushes only a file opened for writing
            # Hash what reached the file, not what was meant to: the two differ if the writer misbehaved.
            while digest is not None and (block := handle.read(1 << 22)):
                digest.update(block)
            handle.flush()
            os.fsync(handle.fileno())  # the rename must not reach the disk before the bytes do
        if os.name != "nt":  # Windows files have no mode bits to set
            os.chmod(tmp, 0o666 & ~_umask())  # before the rename: `path` never exists with other permissions
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # only still there when writing failed
    _fsync_dir(path.parent)
    return digest.hexdigest() if digest is not None else None
