"""`resid --help`, `--version` and argument errors answer without importing torch, pandas or plotly (issue 27):
building the parser imports only the subcommand modules, which import what `run` needs inside it. Each case runs
in a fresh interpreter, which reports the heavy modules it imported and the CPU time it used."""

import json
import subprocess
import sys

import pytest

import resid

HEAVY = ("torch", "pandas", "plotly", "numpy", "transformers", "tokenizers", "safetensors")
PROBE = """
import json, resource, sys
from resid.analyses.cli.main import main
try:
    status = main(sys.argv[1:])
except SystemExit as exit:
    status = exit.code
usage = resource.getrusage(resource.RUSAGE_SELF)
heavy = sorted(name for name in {heavy!r} if name in sys.modules)
print(json.dumps({{"status": status, "heavy": heavy, "cpu": usage.ru_utime + usage.ru_stime}}), file=sys.stderr)
"""

CASES = [
    (["--help"], 0, "usage: resid"),
    (["--version"], 0, f"resid {resid.__version__}"),
    (["ablate", "--help"], 0, "--prompts"),
    (["predict"], 2, "the following arguments are required: text"),  # argparse's own error
    (["lens", "hi", "--dtype", "float64"], 2, "invalid choice: 'float64'"),
    (["predict", "hi", "--top", "0"], 2, "--top must be at least 1"),  # a check() before the model loads
    (["attribute", "hi", "--out", "heads.xlsx"], 2, "must end in one of"),
    (["ablate", "--prompts", "missing.jsonl", "--out", "r.parquet"], 2, "does not exist"),
]


@pytest.mark.parametrize("argv, status, shown", CASES, ids=[" ".join(argv) for argv, _, _ in CASES])
def test_help_version_and_argument_errors_import_nothing_heavy(argv, status, shown, tmp_path):
    result = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), *argv], capture_output=True,
                            text=True, cwd=tmp_path, timeout=60)
    report = json.loads(result.stderr.strip().splitlines()[-1])
    assert report["status"] == status and shown in result.stdout + result.stderr, result
    assert report["heavy"] == [], f"resid {' '.join(argv)} imported {report['heavy']}"
    # torch alone costs ~1.5 s of CPU; without it the command needs ~0.05 s. The bound leaves room for slow CPUs.
    assert report["cpu"] < 1.0, report


def test_the_probe_sees_heavy_imports():
    # The control: a command that loads a model does import torch, and the probe reports it.
    result = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), "info", "--model", "no-such-model"],
                            capture_output=True, text=True, timeout=120, env={"HF_HUB_OFFLINE": "1", "PATH": ""})
    report = json.loads(result.stderr.strip().splitlines()[-1])
    assert report["status"] == 2 and "torch" in report["heavy"]


def test_import_resid_is_light_and_the_names_still_resolve():
    # resid.load stays the function after its subpackage's modules are imported (they share the name)
    code = ("import sys, resid; light = 'torch' not in sys.modules; import resid.load.hf; "
            "print(light, resid.Transformer.__name__, resid.Site.__name__, callable(resid.load), "
            "sorted(resid.known_models())[0], 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.split() == ["True", "Transformer", "Site", "True", "all-minilm-l6-v2", "True"]
