"""benchmarks/bench_gpu.py and gpu_check.sh, whose figures need a GPU, still run where none is. Fast: the new stages'
pieces on a tiny random model on the CPU (the profile summary and its table, the CLT's steps against their FLOP
bound, the SAEs against their multiply-add bound, the transcoder comparison at an equal token budget, the summary's
targets). Slow: every workload of bench_gpu.py at toy size on the real SmolLM2 shapes, and gpu_check.sh --smoke."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tokenizers
import torch
from random_models import make_random_model

import resid

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import compare_transcoders  # noqa: E402
import gpu_dictionaries  # noqa: E402
import gpu_summary  # noqa: E402
from gpu_profile import Profiles  # noqa: E402
from gpu_workloads import forward_macs  # noqa: E402

WORKLOADS = {"header", "forward", "head DLA", "head ablation sweep", "exact head patching", "OOM back-off",
             "dictionaries", "training", "per-layer transcoder steps", "clt transcoder steps", "graph"}
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model() -> resid.Transformer:
    raw = tokenizers.Tokenizer.from_file(str(ROOT / "tests" / "data" / "gpt2-tokenizer" / "tokenizer.json"))
    return make_random_model("llama_gqa", resid.Tokenizer(raw, bos_token_id=50256, prepend_bos=False,
                                                               eos_token_id=50256))


@pytest.fixture(autouse=True)
def single_threaded(one_thread):
    """Every test here on one thread (tests/conftest.py's one_thread)."""


def test_a_profile_counts_what_the_call_does_and_writes_its_table(model, tmp_path) -> None:
    profiles = Profiles(tmp_path, CPU).under("tiny fp32")
    ids = torch.randint(0, model.config.d_vocab, (2, 8), generator=torch.Generator().manual_seed(0))
    x = torch.randn(4)
    reads = {n: profiles(f"reads {n}", lambda n=n: [x.sum().item() for _ in range(n)]) for n in (2, 7)}
    assert reads[2]["host_reads"] == 2 and reads[7]["host_reads"] == 7  # each value read to Python, counted once
    assert reads[7]["ops"] > reads[2]["ops"]
    forward = profiles("forward", lambda: model.run(ids))
    assert forward["wall_s"] > 0 and 0 < forward["host_s"] and forward["ops"] > 10
    # the CUDA columns are empty on the CPU, the heaviest operators ranked by their share of the self time
    assert forward["device_s"] is None and forward["launches"] is None and forward["syncs"] is None
    shares = [row["share"] for row in forward["top"]]
    assert 0 < len(shares) <= 8 and shares == sorted(shares, reverse=True) and sum(shares) <= 1 + 1e-9
    text = Path(forward["file"]).read_text()
    assert Path(forward["file"]).name == "tiny-fp32-forward.txt" and text.startswith("# tiny fp32 forward\n")
    assert "host reads" in text and forward["top"][0]["name"][:60] in text
    # gradients on where asked (a training step), off otherwise; profiling nothing costs nothing
    w = torch.randn(3, requires_grad=True)
    assert profiles("backward", lambda: (w * 2).sum().backward(), grad=True)["ops"] > 0
    assert "failed" in profiles("no grad", lambda: (w * 2).sum().backward())
    assert Profiles(None, CPU)("anything", lambda: 1 / 0) is None


def test_the_dictionaries_are_held_to_their_multiply_add_bound(model) -> None:
    record = gpu_dictionaries.observe(model, 2, 16, 64, 8, repeats=1)
    n, d = model.config.n_layers, model.config.d_model
    assert record["saes"] == n
    assert math.isclose(record["bound_ratio"], 1 + 2 * 16 * n * d * 64 / forward_macs(model.config, 2, 16))
    assert math.isclose(record["observe_over_bound"], record["observe_over_plain"] / record["bound_ratio"])


def test_transcoder_flops_count_the_clts_decoder_blocks() -> None:
    n, tokens, d, f, k = 4, 32, 16, 64, 3
    per_layer, clt = (gpu_dictionaries.transcoder_flops(kind, tokens, n, d, d, f, k) for kind in ("per-layer", "clt"))
    assert per_layer == 6 * (tokens * n * d * f + tokens * k * d * n)
    assert clt - per_layer == 6 * tokens * k * d * (n * (n + 1) // 2 - n)


def test_the_clt_steps_are_measured_against_their_flop_bound_and_profiled_after(model, tmp_path) -> None:
    profiles = Profiles(tmp_path, CPU).under("tiny fp32")
    records = gpu_dictionaries.clt_steps(model, 32, 16, 4, 1, profiles)
    by = {r["workload"]: r for r in records}
    assert set(by) == {"per-layer transcoder steps", "clt transcoder steps"}
    for r in records:
        assert r["tokens_per_s"] > 0 and 0 < r["flop_fraction"] and r["matmul_tflops"] > 0
    # the profiles wait until the records are written (a run stopped while profiling keeps them), then one each
    assert len(profiles.pending) == 2
    found: list[dict] = []
    profiles.flush(found.append, dict(model="tiny", dtype="fp32"))
    assert not profiles.pending and [r["of"] for r in found] == ["per-layer transcoder step", "clt transcoder step"]
    for r in found:
        assert r["workload"] == "profile" and r["model"] == "tiny" and r["ops"] > 0 and Path(r["file"]).exists()
        assert Path(r["file"]).name.startswith("tiny-fp32-")
    # the CLT's decoders into every later layer: more weights than one transcoder per layer
    assert by["clt transcoder steps"]["weights"] > by["per-layer transcoder steps"]["weights"]


@pytest.fixture(scope="module")
def comparison(model) -> tuple[list[dict], int]:
    settings = dict(expansion=2, d_sae=8, k=2, dead_tokens=None)
    stream = dict(window=16, forward_batch=2, buffer_tokens=96)
    split = compare_transcoders.data.split(compare_transcoders.corpus.demo(max_documents=30), 0.1)
    tokens, per_step = compare_transcoders.budget_for(model, split[0], ["per-layer", "clt"], 0.01, 32, settings,
                                                      **stream, probe_steps=2)
    assert set(per_step) == {"per-layer", "clt", "forward"} and min(per_step.values()) >= 0
    records = compare_transcoders.compare(model, "tiny", "random", ["per-layer", "clt"], tokens, 32, settings,
                                          prompts=("The cat sat on the",), eval_windows=2, eval_window=16,
                                          max_feature_nodes=16, split=split, **stream)
    return records, tokens


def test_the_transcoder_comparison_trains_every_kind_on_the_same_budget_and_scores_it(comparison) -> None:
    records, tokens = comparison
    assert tokens == 8 * 32  # 0.01 s of steps: the fewest batches allowed
    assert [r["replacement"] for r in records] == ["per-layer", "clt"]
    assert [r["kind"] for r in records] == ["per-layer", "cross-layer"]
    for r in records:
        assert r["tokens"] == tokens and r["steps"] == 8 and r["weights"] == "random" and r["model"] == "tiny"
        assert r["tokens_per_s"] > 0 and r["flop_fraction"] > 0 and r["generation_s"] >= 0
        assert math.isfinite(r["fvu"]) and math.isfinite(r["ce_loss_recovered"]) and r["eval_tokens"] > 0
        assert r["prompts"] == 1 and math.isfinite(r["replacement_score"])
    assert "| per-layer | per-layer |" in compare_transcoders.table(records)


def test_the_summary_states_each_target_met_missed_or_not_measured(model, comparison, tmp_path) -> None:
    records = [dict(workload="header", device="CPU", weights="random")]
    context = dict(model="tiny", dtype="fp32")
    profiles = Profiles(tmp_path, CPU)
    records += [{**context, **r} for r in gpu_dictionaries.clt_steps(model, 32, 16, 4, 1, profiles)]
    profiles.flush(records.append, context)
    records += comparison[0]
    records.append(dict(workload="stage", stage="capture", budget_s=55, seconds=55, rc=124))
    records.append({**context, "workload": "head DLA", "failed": "RuntimeError: broken"})
    rows = gpu_summary.target_rows(records)
    clt = [r for r in rows if r["what"].startswith("cross-layer")]
    assert len(clt) == 1 and clt[0]["where"] == "tiny fp32"
    assert clt[0]["status"] == ("met" if clt[0]["value"] >= 0.45 else "MISSED")
    unmeasured = {r["what"] for r in rows if r["status"] == "not measured"}
    assert len(unmeasured) == len(gpu_summary.TARGETS) - 1  # nothing else was measured
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"cut short')  # a killed writer's last line
    text = gpu_summary.summary(gpu_summary.read(path))
    assert "| capture | 55 s | 55 s | stopped at its time limit |" in text
    assert "## Transcoders compared" in text and "| per-layer | per-layer |" in text
    assert "tiny fp32 head DLA: RuntimeError: broken" in text
    assert "- tiny fp32 clt transcoder step: host " in text  # the profiles, one line each


@pytest.mark.slow
def test_the_gpu_benchmark_runs_every_workload_on_the_cpu(tmp_path) -> None:
    out = tmp_path / "results.jsonl"
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--smoke", "--device", "cpu", "--models",
               "smollm2-135m", "--dtypes", "fp32", "--dla", "2", "--sweep", "1", "--pairs", "1", "--train-steps", "2",
               "--out", str(out), "--profile", str(tmp_path / "profiles")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["workload"] for r in records} == WORKLOADS | {"profile"} and not any("failed" in r for r in records)
    by = {r["workload"]: r for r in records}
    forward = [r for r in records if r["workload"] == "forward"]
    assert [r["shape"] for r in forward] == ["1x16", "2x32"]
    assert forward[0]["max_logit_gap"] < 1e-3  # resid and transformers compute the same logits
    for record in forward:
        for case in ("transformers_sdpa", "resid_no_capture", "resid_default_capture", "resid_full_capture"):
            assert record[case]["seconds"] > 0 and record[case]["ratio"] > 0
    profiled = {r["of"] for r in records if r["workload"] == "profile"}
    assert {"forward 2x32 resid_full_capture", "head DLA", "training 4 steps", "clt transcoder step"} <= profiled
    assert by["head ablation sweep"]["rows"] == by["exact head patching"]["rows"] == 30 * 9  # one prompt, every head
    assert by["head DLA"]["rows"] > 0 and all(0 < by[w]["bound_fraction"] for w in ("head DLA", "head ablation sweep"))
    backoff = by["OOM back-off"]
    assert backoff["same_rows"] and not backoff["escaped"] and max(backoff["max_gap"].values()) < 1e-4
    assert by["training"]["dictionaries"] == 30 and by["graph"]["features"] > 0
    assert "== targets" in done.stdout and "| plain forward (no capture)" in done.stdout


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


@pytest.mark.slow
def test_the_gpu_check_smoke_runs_its_stages_and_explains_itself(tmp_path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "STAGES": "setup training transcoders", "DTYPES": "fp32"}
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(tmp_path), "--smoke"], env=env,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = (tmp_path / "summary.md").read_text()
    for stage in ("setup", "training", "transcoders"):
        assert f"| {stage} |" in text
    assert "| cross-layer transcoder steps, share of the FLOP bound | smollm2-tiny fp32 |" in text
    assert "## Transcoders compared" in text and list((tmp_path / "profiles").glob("*.txt"))
