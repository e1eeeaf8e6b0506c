"""RESID_TYPECHECK=1 turns on the jaxtyping + beartype checks outside pytest. Each case runs in a fresh
interpreter, since the import hook only instruments modules imported after it, and pytest's own hook
(--jaxtyping-packages) is already active in this process."""

import os
import subprocess
import sys

# rotate_half takes Float[Tensor, "... d"]; given int64 ids, it runs unchecked (chunk and cat accept any dtype).
SCRIPT = """
import torch
import resid
from resid.components.rotary import rotate_half
import resid.analyses.metrics
try:
    rotate_half(torch.arange(8))
except Exception as err:
    print("raised", type(err).__module__, type(err).__name__)
else:
    print("no error")
try:
    resid.analyses.metrics.metric_values("logit", torch.zeros(2, 5), torch.zeros(3, dtype=torch.long))
except Exception as err:
    print("raised", type(err).__module__, type(err).__name__)
else:
    print("no error")
"""


def _run(typecheck: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "RESID_TYPECHECK"}
    if typecheck is not None:
        env["RESID_TYPECHECK"] = typecheck
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300,
                            check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_resid_typecheck_1_checks_resid_and_analyses():
    resid_line, analyses_line = _run("1")
    # jaxtyping raises its TypeCheckError, beartype its BeartypeCallHint... errors: either names its library.
    for line in (resid_line, analyses_line):
        assert line.startswith(("raised jaxtyping", "raised beartype")), line


def test_without_it_nothing_is_checked():
    resid_line, analyses_line = _run("0")  # any value but "1" (unset is the same path: the variable is not "1")
    assert resid_line == "no error"
    # metric_values still fails, but on the mismatched rows inside torch, not in a type check.
    assert not analyses_line.startswith(("raised jaxtyping", "raised beartype")), analyses_line
