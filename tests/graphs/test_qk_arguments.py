"""QK.score takes positions and heads as whole numbers: int(1.5) and int(True) both read as 1, so key=1.5 or
key=True scored key 1 without a word. Both are refused naming the argument (a bool in any process; a float is
refused by beartype where the type checks are on, as in pytest, and by resid's own check where they are off)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from random_models import make_random_model
from random_transcoders import per_layer

import resid
from resid.analyses.graphs.qk import QK

IDS = [11, 5, 7, 2, 9, 31, 3]


@pytest.mark.parametrize("kwargs, name", [(dict(key=True), "key"), (dict(key=2, versus=False), "versus"),
                                          (dict(query=True, key=0), "query"), (dict(head=True, key=2), "head"),
                                          (dict(site=True, head=None, key=2), "layer")])
def test_bools_are_refused_as_positions_and_heads(kwargs, name) -> None:
    model = make_random_model("llama_gqa")
    qk = QK(model, IDS, per_layer(model))
    with pytest.raises(resid.ResidError, match=f"{name}=(True|False).* must be a whole number .an int"):
        qk.score(**{"site": 1, "head": 0, **kwargs})


UNCHECKED = """
from random_models import make_random_model
from random_transcoders import per_layer
import resid
from resid.analyses.graphs.qk import QK
model = make_random_model("llama_gqa")
qk = QK(model, [11, 5, 7, 2, 9, 31, 3], per_layer(model))
for kwargs in (dict(key=1.5), dict(key=2, versus=0.0), dict(head=0.0, key=2)):
    try:
        qk.score(1, **{"head": 0, **kwargs})
    except resid.ResidError as error:
        print(str(error).split(":")[0])
"""


def test_floats_are_refused_without_the_type_checks() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RESID_TYPECHECK"}
    tests = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (tests, env.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, "-c", UNCHECKED], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["key=1.5 must be a whole number (an int; negative counts from the end), not "
                                       "float", "versus=0.0 must be a whole number (an int; negative counts from "
                                       "the end), not float", "head=0.0 must be a whole number (an int; negative "
                                       "counts from the end), not float"], out.stdout
