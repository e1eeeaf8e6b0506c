"""Keeping freed CPU memory for reuse between runs.

With glibc's default settings, a large freed block (a captured activation, a batch of logits) goes straight back
to the OS, and the next run faults the same amount in again as fresh zeroed pages: a full capture then costs
~1.4x a plain forward on CPU instead of ~1.1x. `resid.load` therefore asks glibc to serve large blocks from its
heap and to keep freed memory there (the process stays at its peak size instead of shrinking between runs). Set
RESID_KEEP_FREED_MEMORY=0 before loading, or call keep_freed_memory(False), to keep glibc's defaults. Other C
libraries (macOS, musl) are left as they are.
"""

import ctypes
import ctypes.util
import os
import platform

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
# blocks up to 1 GiB from the heap; trim only a free top of 2 GiB (mallopt takes a C int: 2**31 - 1 at most)
_KEEP = {_M_MMAP_THRESHOLD: 1 << 30, _M_TRIM_THRESHOLD: (1 << 31) - 1}
_DEFAULTS = {_M_MMAP_THRESHOLD: 128 * 1024, _M_TRIM_THRESHOLD: 128 * 1024}  # glibc's (fixed, not dynamic)
_state: dict[str, bool] = {}


def keep_freed_memory(enabled: bool = True) -> bool:
    """Keep freed memory for reuse (True) or give it back to the OS as glibc does by default (False). Returns
    whether the setting took effect (False where the C library is not glibc)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    settings = _KEEP if enabled else _DEFAULTS
    done = all(libc.mallopt(ctypes.c_int(option), ctypes.c_int(value)) == 1 for option, value in settings.items())
    _state["enabled"] = enabled and done
    return done


def keep_by_default() -> None:
    """What resid.load does: keep freed memory once per process, unless RESID_KEEP_FREED_MEMORY=0."""
    if "enabled" not in _state and os.environ.get("RESID_KEEP_FREED_MEMORY", "1") != "0":
        keep_freed_memory(True)
