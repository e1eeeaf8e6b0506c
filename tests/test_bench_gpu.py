"""benchmarks/bench_gpu.py, whose figures need a GPU, still runs where none is: every workload at toy size on the
CPU (--smoke), recorded with the quantities its report and targets read. Slow: the real SmolLM2 and transformers."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = {"header", "forward", "head DLA", "head ablation sweep", "exact head patching", "OOM back-off",
             "dictionaries", "training", "graph"}


@pytest.mark.slow
def test_the_gpu_benchmark_runs_every_workload_on_the_cpu(tmp_path) -> None:
    out = tmp_path / "results.jsonl"
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--smoke", "--device", "cpu", "--models",
               "smollm2-135m", "--dtypes", "fp32", "--dla", "2", "--sweep", "1", "--pairs", "1", "--train-steps", "2",
               "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["workload"] for r in records} == WORKLOADS and not any("failed" in r for r in records)
    by = {r["workload"]: r for r in records}
    forward = [r for r in records if r["workload"] == "forward"]
    assert [r["shape"] for r in forward] == ["1x16", "2x32"]
    assert forward[0]["max_logit_gap"] < 1e-3  # resid and transformers compute the same logits
    for record in forward:
        for case in ("transformers_sdpa", "resid_no_capture", "resid_default_capture", "resid_full_capture"):
            assert record[case]["seconds"] > 0 and record[case]["ratio"] > 0
    assert by["head ablation sweep"]["rows"] == by["exact head patching"]["rows"] == 30 * 9  # one prompt, every head
    assert by["head DLA"]["rows"] > 0 and all(0 < by[w]["bound_fraction"] for w in ("head DLA", "head ablation sweep"))
    backoff = by["OOM back-off"]
    assert backoff["same_rows"] and not backoff["escaped"] and max(backoff["max_gap"].values()) < 1e-4
    assert by["training"]["dictionaries"] == 30 and by["graph"]["features"] > 0
    assert "== targets" in done.stdout and "resid_no_capture <= 1.05x" in done.stdout


@pytest.mark.slow
def test_random_weights_of_both_architectures_give_transformers_logits(tmp_path) -> None:
    """--weights random (for a GPU machine that cannot receive the GGUF files): both libraries load the same
    random safetensors folder, and resid's logits are transformers'."""
    out = tmp_path / "results.jsonl"
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--smoke", "--device", "cpu", "--weights",
               "random", "--models", "smollm2-135m,gemma-3-270m", "--dtypes", "fp32", "--only", "forward",
               "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records[0]["weights"] == "random"
    gaps = {r["model"]: r["max_logit_gap"] for r in records if "max_logit_gap" in r}
    assert set(gaps) == {"smollm2-135m", "gemma-3-270m"} and max(gaps.values()) < 1e-3
