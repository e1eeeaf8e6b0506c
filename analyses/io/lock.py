"""One writer per output: the exclusive lock a store holds on `<out>.lock` while it writes `out` (a `ResultStore`
its table, resid.analyses.io.checkpoints's `StateStore` its folder's checkpoint).

Two processes sweeping into the same `out` would interleave their chunks under one signature and lose rows (the
signature is read once, when a store opens), and two trainings into one folder would overwrite each other's
checkpoints, so the second one is refused at once, with the first one's pid.

The lock is the kernel's (`fcntl.flock`; `msvcrt.locking` on Windows), so it ends with its process however that
ends: a killed sweep leaves no stale lock, only the file, which the next writer reuses. The file holds the
holder's pid and command line, for the message that refuses a second writer. A releasing holder deletes the file;
a process that opened it just before then finds, once locked, that the path no longer names its file, and opens
the new one (so two writers never hold two different files of one path).

Within one process the newest store of an `out` takes the lock over from an older one (a notebook re-runs a cell
while a traceback still holds the interrupted sweep's store); the older store is then `superseded`.
"""

import os
import sys
from pathlib import Path

from resid.errors import ResidError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
    import msvcrt

_WINDOWS_LOCK_AT = 1 << 20
_HELD: dict[str, "OutputLock"] = {}  # lock path -> the lock of this process that holds it


class Holder:
    """A writer that holds its output's OutputLock (`self._lock`, made in its constructor) until `close()`, the end
    of a `with` block, or its own end, whichever comes first (ResultStore, StateStore)."""

    _lock: "OutputLock"

    def close(self) -> None:
        """Release the lock; what was written stays for a later run to resume from."""
        self._lock.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        lock = getattr(self, "_lock", None)  # absent when the constructor raised before making it
        if lock is not None:
            lock.release()


class OutputLock:
    """The lock file `path` of the output `out`; `acquire` raises a ResidError naming the holder."""

    def __init__(self, path: Path, out: Path):
        self.path, self.out = Path(path), Path(out)
        self._key = os.path.abspath(self.path)
        self._fd: int | None = None
        self.superseded = False

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self.held:
            return
        older = _HELD.get(self._key)
        if older is not None and older is not self:  # same process: take the lock over
            self._fd, older._fd, older.superseded = older._fd, None, True
        else:
            self._fd = self._lock_file()
        _HELD[self._key] = self
        self.superseded = False
        os.ftruncate(self._fd, 0)
        os.lseek(self._fd, 0, os.SEEK_SET)
        os.write(self._fd, f"{os.getpid()}\n{' '.join(sys.argv)[:300]}\n".encode())

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        if _HELD.get(self._key) is self:
            del _HELD[self._key]
        try:
            if fcntl is not None and _same_file(fd, self.path):
                self.path.unlink()  # before unlocking: see the module docstring
        finally:
            os.close(fd)  # closing the last descriptor releases the lock

    def _lock_file(self) -> int:
        for _ in range(100):  # another holder releasing at the same moment: open the new file
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as error:
                raise ResidError(f"Cannot create the lock file {self.path} beside {self.out} ({error.strerror}): "
                                 "the folder must exist or be creatable, and be writable. Choose another output "
                                 "path.") from None
            try:
                if fcntl is not None:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                else:  # a byte past the pid and command line, so that others can still read them
                    os.lseek(fd, _WINDOWS_LOCK_AT, os.SEEK_SET)
                    msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            except OSError:
                holder = _holder(fd)
                os.close(fd)
                raise ResidError(
                    f"Another process ({holder}) is writing results to {self.out}: it holds the lock {self.path}. "
                    "Two writers of one output would mix their rows or overwrite each other's checkpoints. Wait for it "
                    "to finish (or stop it), or choose another output path."
                ) from None
            if fcntl is None or _same_file(fd, self.path):
                return fd
            os.close(fd)
        raise ResidError(f"Could not lock {self.path}: other processes keep replacing it. Try again.")


def holder(path: Path) -> str | None:
    """Who holds the lock file `path` now ("pid 1234: resid ablate ..."), or None: a look that takes nothing and
    creates nothing, for callers that want to refuse early (the command line, before loading a model). The store
    itself still locks, since the answer may change at once."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:  # no lock file: no writer (or none we could ask)
        return None
    try:
        if fcntl is None:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return _holder(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _holder(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    pid, _, command = os.read(fd, 400).decode(errors="replace").partition("\n")
    if not pid.strip().isdigit():  # the holder has not written its pid yet
        return "pid unknown"
    return f"pid {pid.strip()}" + (f": {command.strip()}" if command.strip() else "")
