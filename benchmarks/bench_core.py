"""Core benchmark: resid vs Hugging Face transformers on SmolLM2-135M, same weights, same inputs, one process.

    python benchmarks/bench_core.py [--batch 8] [--pos 64] [--repeats 10]

Prints median wall times and the ratios the core issue targets:
  run() without capture <= 1.05x HF's forward; run(Capture.all()) <= 1.15x; cold GGUF load <= 3 s.
HF's forward is its fastest plain mode: use_cache=False (resid builds no cache) with eager and with SDPA attention,
both timed, the faster of the two the baseline every ratio is taken against. Both cold loads are timed the same way:
fresh subprocesses, median of 3 (import excluded; resid's also with import).

Allocator note: with glibc's default settings, large freed blocks go back to the OS and the next forward
pass faults them in again (zeroed pages). That costs every framework alike, but it costs a run that keeps
what it captures (Capture.all: ~500 MB here) more. resid.load therefore asks glibc to keep freed memory for reuse
(resid.allocator; no environment variables), and the main comparison runs that way, HF in the same process under
the same setting. For reference it is repeated in a subprocess with RESID_KEEP_FREED_MEMORY=0 (glibc's defaults).
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

import resid
from resid.load.registry import smollm2_path

COLD = """
import time; t0 = time.perf_counter(); import resid; t1 = time.perf_counter()
resid.load("smollm2-135m"); t2 = time.perf_counter(); print(t2 - t1, t2 - t0)
"""
HF_COLD = """
import sys, time; t0 = time.perf_counter(); import torch, transformers; t1 = time.perf_counter()
from pathlib import Path; path = Path(sys.argv[1])
transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
t2 = time.perf_counter(); print(t2 - t1, t2 - t0)
"""


def cold_load(code: str, repeats: int, *argv: str) -> tuple[float, float]:
    """Median (load, load with import) seconds over `repeats` fresh processes running `code`."""
    loads, totals = [], []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                             check=True).stdout.split()
        loads.append(float(out[-2]))
        totals.append(float(out[-1]))
    return statistics.median(loads), statistics.median(totals)


def timed(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--pos", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--glibc-defaults-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.glibc_defaults_only:
        measure(args, "as resid.load sets it: freed memory kept for reuse (resid.allocator, no environment variables)")
        env = {**os.environ, "RESID_KEEP_FREED_MEMORY": "0"}
        argv = [sys.executable, __file__, "--batch", str(args.batch), "--pos", str(args.pos),
                "--repeats", str(args.repeats), "--glibc-defaults-only"]
        subprocess.run(argv, env=env, check=True)
    else:
        measure(args, "glibc's defaults (RESID_KEEP_FREED_MEMORY=0): freed blocks go back to the OS")


def measure(args, allocator: str) -> None:
    from transformers import AutoModelForCausalLM

    print(f"== {allocator}")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, batch {args.batch} x {args.pos} tokens")
    path = smollm2_path()
    load_s, load_with_import_s = cold_load(COLD, 3)
    hf_load_s, _ = cold_load(HF_COLD, 3, str(path))
    hf = {mode: AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, attn_implementation=mode, dtype=torch.float32).eval()
        for mode in ("eager", "sdpa")}
    model = resid.load("smollm2-135m")

    ids = torch.randint(0, model.config.d_vocab, (args.batch, args.pos), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (hf["sdpa"](ids, use_cache=False).logits - model.run(ids, capture=resid.Capture.none()).logits
                ).abs().max().item()
    cases = {
        "hf_eager": lambda: hf["eager"](ids, use_cache=False),
        "hf_sdpa": lambda: hf["sdpa"](ids, use_cache=False),
        "resid_no_capture": lambda: model.run(ids, capture=resid.Capture.none()),
        "resid_default_capture": lambda: model.run(ids),
        "resid_capture_all": lambda: model.run(ids, capture=resid.Capture.all()),
    }
    times = {name: [] for name in cases}
    with torch.no_grad():
        for fn in cases.values():  # warm-up
            fn()
        for _ in range(args.repeats):  # interleaved so drift hits every case alike
            for name, fn in cases.items():
                times[name] += timed(fn, 1)
    median = {name: statistics.median(t) for name, t in times.items()}
    best = min(median["hf_eager"], median["hf_sdpa"])  # HF's faster mode is the baseline
    print(f"max |logit diff| resid vs HF: {diff:.2e}")
    for name, value in median.items():
        print(f"{name:<24} {value * 1000:8.1f} ms   {value / best:.3f}x HF's faster mode")
    print(f"cold GGUF load (fresh processes, median of 3): resid {load_s:.2f} s (with import {load_with_import_s:.2f} "
          f"s), transformers {hf_load_s:.2f} s ({hf_load_s / load_s:.1f}x slower)")
    print(
        "targets: no capture <= 1.05x "
        f"[{'ok' if median['resid_no_capture'] / best <= 1.05 else 'MISSED'}], capture all <= 1.15x "
        f"[{'ok' if median['resid_capture_all'] / best <= 1.15 else 'MISSED'}], cold load <= 3 s "
        f"[{'ok' if load_s <= 3 else 'MISSED'}]"
    )


if __name__ == "__main__":
    main()
