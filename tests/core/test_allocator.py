"""resid.allocator: glibc keeps freed memory for reuse once a model is loaded, unless asked not to."""

import os
import subprocess
import sys

import pytest

from resid import allocator

PROBE = """
import resid
from resid import allocator
resid.load("smollm2-135m")
print(allocator._state.get("enabled"))
"""


@pytest.mark.skipif(not allocator.keep_freed_memory(True), reason="glibc only")
@pytest.mark.parametrize("setting, expected", [(None, "True"), ("0", "None")])
def test_load_keeps_freed_memory_unless_told_not_to(setting, expected):
    """A fresh process that loads a model has the setting on; RESID_KEEP_FREED_MEMORY=0 leaves glibc alone."""
    env = {k: v for k, v in os.environ.items() if k != "RESID_KEEP_FREED_MEMORY"}
    if setting is not None:
        env["RESID_KEEP_FREED_MEMORY"] = setting
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[-1] == expected


@pytest.mark.skipif(not allocator.keep_freed_memory(True), reason="glibc only")
def test_freed_blocks_are_reused_without_faulting_in():
    """With the setting on, a large block freed and allocated again comes back from the heap (the page faults of
    thirty rounds stay within a few blocks); with glibc's defaults every round faults the whole block in again."""
    code = """
import resource, sys, torch
from resid import allocator
allocator.keep_freed_memory(sys.argv[1] == "keep")
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
torch.empty(2**24).fill_(1.0)
start = faults()
for _ in range(30):
    torch.empty(2**24).fill_(1.0)  # 64 MiB, freed at once
print(faults() - start)
"""
    counts = {mode: int(subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True,
                                       check=True).stdout) for mode in ("keep", "default")}
    pages = 2**26 // 4096  # one block
    assert counts["default"] > 25 * pages and counts["keep"] < 12 * pages
    allocator.keep_freed_memory(True)
