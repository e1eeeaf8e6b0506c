"""benchmarks/bench_scale.py at Llama-3.2-1B's shape (the 8B benchmark's code, a tenth of its size): a random
bf16 checkpoint sharded as transformers writes it loads memory-mapped (the load itself reads almost nothing), runs
every workload, and gives transformers' logits (from transformers' own process). Slow: 2.5 GB written, then every
workload on 1.2B parameters."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_scale_benchmark_at_1b(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_scale.py"), "--shape", "1b", "--folder",
               str(tmp_path / "llama-1b"), "--pairs", "2", "--heads", "4", "--tokens", "32", "--graph-tokens", "8",
               "--width", "128", "--max-feature-nodes", "16", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert len(list((tmp_path / "llama-1b").glob("model-0000?-of-00001.safetensors"))) == 1
    rows = {(row["library"], row["workload"].split(",")[0]): row for row in result["rows"]}
    assert set(rows) == {("resid", w) for w in ("load (bf16", "forward", "decomposition by head", "ablation sweep",
                                                 "exact patching", "AtP", "graph")} | {
        ("transformers", "load (bf16)"), ("transformers", "forward")} | {
        (library, "load + first forward") for library in ("resid", "transformers")}
    weights = 1.236e9 * 2 / 2**30  # GiB of bf16 values
    load = rows[("resid", "load (bf16")]
    assert load["peak_rss_gib"] - load["rss_before_gib"] < 0.25 * weights  # mapped, not read
    assert result["max_logit_difference"] < 0.05 * result["logit_std"] and result["top1_agreement"] == 1.0
    assert "active" in rows[("resid", "graph")]["note"]
