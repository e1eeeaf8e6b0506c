"""Script use of ablation sweeps: the CLI, kill-and-resume, bad input, and agreement with a hook on the
transformers model."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from bad_option import BAD_OPTION
from tiny_fixtures import Tiny
from tiny_models import build, hf_attn, hf_mlp

import resid
from resid.analyses import ablation
from resid.analyses.cli.main import main

NAMES = ["Mary", "John", "Anna", "Paul", "Kate", "Mark", "Lucy", "Tom"]


def _prompt_lines(n: int) -> list[dict]:
    lines = []
    for i in range(n):
        a, b = NAMES[i % 8], NAMES[(i + 3) % 8]
        lines.append({"prompt": f"When {a} and {b} went to the store, {b} gave a drink to",
                      "target": f" {a}", "baseline": f" {b}"})
    return lines


def _write_jsonl(path: Path, lines: list) -> Path:
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def test_zero_sublayer_sweep_matches_hf_hook(tiny: Tiny):
    lines = _prompt_lines(2)
    prompts, targets = [x["prompt"] for x in lines], [x["target"] for x in lines]
    df = ablation.sweep(tiny.model, prompts, targets, sites="sublayer", metric="logit")
    for part, module in (("attn", hf_attn), ("mlp", hf_mlp)):
        def zero(mod, args, output):
            return (torch.zeros_like(output[0]), *output[1:]) if isinstance(output, tuple) else torch.zeros_like(output)

        handle = module(tiny.hf, 1).register_forward_hook(zero)
        try:
            for i, prompt in enumerate(prompts):
                ids = tiny.model.to_tokens(prompt).ids
                with torch.no_grad():
                    logits = tiny.hf(input_ids=ids).logits[0, -1]
                target = tiny.model.tokenizer.encode(targets[i], prepend_bos=False)[0]
                row = df[(df.prompt_idx == i) & (df.site == f"layers[1].{part}")]
                torch.testing.assert_close(row.ablated_metric.item(), logits[target].item(), atol=1e-5, rtol=1e-5)
        finally:
            handle.remove()


@pytest.mark.slow
def test_cli_writes_results_and_figure(tmp_path, capsys):
    prompts = _write_jsonl(tmp_path / "p.jsonl", _prompt_lines(2))
    out = tmp_path / "r.csv"
    assert main(["ablate", "--prompts", str(prompts), "--sites", "layer", "--out", str(out), "--quiet",
                 "--shared-js"]) == 0
    assert capsys.readouterr().out.startswith("60 rows (2 prompts)")  # 2 prompts x 30 layers
    df = pd.read_csv(out)
    assert len(df) == 2 * 30 and set(df.part) == {"layer"} and (df.metric == "logit_diff").all()
    html = (tmp_path / "r.html").read_text()
    assert "plotly" in html and len(html) < 1_000_000  # plotly.js is in the shared plotly.min.js beside it
    assert (tmp_path / "plotly.min.js").exists()


@pytest.mark.slow
def test_kill_and_resume(tmp_path):
    folder = tmp_path / "model"
    build("llama", folder)
    model = resid.load(folder)
    prompts = _write_jsonl(tmp_path / "p.jsonl", _prompt_lines(40))
    out = tmp_path / "results.parquet"
    command = [sys.executable, "-m", "resid.analyses.cli.main", "ablate", "--model", str(folder),
               "--prompts", str(prompts),
               "--sites", "head", "--batch-size", "1", "--out", str(out), "--quiet"]
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    parts = Path(str(out) + ".parts")
    deadline = time.time() + 120
    while time.time() < deadline and len(list(parts.glob("chunk-*"))) < 5 and child.poll() is None:
        time.sleep(0.01)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert not out.exists(), "the sweep finished before it could be killed: make it longer"
    written = len(list(parts.glob("chunk-*")))
    assert written >= 5
    finished = subprocess.run(command, capture_output=True, text=True)
    assert finished.returncode == 0, finished.stderr
    df = pd.read_parquet(out)
    n_rows = 40 * model.config.n_layers * model.config.n_heads
    assert len(df) == n_rows and not df.duplicated(["prompt_idx", "site"]).any()
    lines = _prompt_lines(40)
    fresh = ablation.sweep(model, [x["prompt"] for x in lines], [x["target"] for x in lines],
                           [x["baseline"] for x in lines], sites="head")
    merged = fresh.merge(df, on=["prompt_idx", "site"], suffixes=("", "_resumed"))
    assert len(merged) == n_rows
    torch.testing.assert_close(torch.tensor(merged.ablated_metric_resumed.to_numpy()),
                               torch.tensor(merged.ablated_metric.to_numpy()), atol=1e-5, rtol=0)


def test_bad_input(tmp_path, tiny: Tiny):
    model = tiny.model
    prompts, targets = ["When Mary and John went"], [" Mary"]
    with pytest.raises(BAD_OPTION, match=r"(?s)sites.*'neurons'"):
        ablation.sweep(model, prompts, targets, sites="neurons")
    with pytest.raises(resid.ResidError, match="out of range"):
        ablation.sweep(model, prompts, targets, sites=[resid.Site(7, "mlp")])
    with pytest.raises(resid.ResidError, match="needs reference texts"):
        ablation.sweep(model, prompts, targets, method="mean")
    with pytest.raises(resid.ResidError, match=r"is 2 tokens.*explicit token id"):
        ablation.sweep(model, prompts, [" Maryland is"])
    with pytest.raises(resid.ResidError, match="needs baselines"):
        ablation.sweep(model, prompts, targets, metric="logit_diff")
    with pytest.raises(BAD_OPTION, match=r"(?s)method.*'noise'"):
        ablation.sweep(model, prompts, targets, method="noise")
    bad = _write_jsonl(tmp_path / "bad.jsonl", [_prompt_lines(1)[0], '{"prompt": "x", "target": " a"', "{}"])
    from resid.analyses.io.prompts_file import read_jsonl

    with pytest.raises(resid.ResidError, match="line 2: not valid JSON"):
        read_jsonl(bad)


@pytest.mark.slow
def test_errors_never_destroy_finished_results(tmp_path, capsys):
    prompts = _write_jsonl(tmp_path / "p.jsonl", _prompt_lines(2))
    out = tmp_path / "r.parquet"
    assert main(["ablate", "--prompts", str(prompts), "--sites", "layer", "--out", str(out), "--quiet"]) == 0
    before = out.read_bytes()
    # A different sweep aimed at the same file is refused; a malformed prompts file fails before anything runs.
    reference = tmp_path / "reference.txt"
    reference.write_text("Some reference text to average over.\nAnd a second line of it.\n")
    assert main(["ablate", "--prompts", str(prompts), "--method", "mean", "--reference", str(reference),
                 "--out", str(out), "--quiet"]) == 2
    assert "different sweep" in capsys.readouterr().err
    broken = _write_jsonl(tmp_path / "broken.jsonl", ["not json"])
    assert main(["ablate", "--prompts", str(broken), "--out", str(out), "--quiet"]) == 2
    assert "line 1" in capsys.readouterr().err
    assert out.read_bytes() == before
    # Re-running the finished sweep recomputes nothing and returns the same rows.
    assert main(["ablate", "--prompts", str(prompts), "--sites", "layer", "--out", str(out), "--quiet"]) == 0
    assert len(pd.read_parquet(out)) == 60
