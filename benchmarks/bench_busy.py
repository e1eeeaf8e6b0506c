"""A busy second core: how much resid's forward slows down when another process spins on one of the cores its
threads use, beside how much transformers' slows down, on SmolLM2-135M (same weights, same inputs, one process).

    python benchmarks/bench_busy.py [--dtype bfloat16] [--batch 1] [--pos 128] [--repeats 10] [--threads 2]

Each library's forward is timed first with the machine as it is ("quiet"), then while a child process spins on
the last core this process may use ("busy"); the two libraries' runs are interleaved, so drift hits both alike.
With several threads, every parallel kernel waits for its slowest thread, and a thread sharing a core with the
spinner runs only in the scheduler's slices: a forward made of many small parallel kernels waits many times. On a
shared machine absolute times are noisy; the ratio busy / quiet of each library, measured in the same run, is the
figure to compare.
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

SPIN = "while True: pass"


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def measure(cases: dict, repeats: int) -> dict[str, float]:
    """Median ms of each case, the cases interleaved repeat by repeat."""
    times = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            times[name].append(median_ms(fn, 1))
    return {name: statistics.median(t) for name, t in times.items()}


def spinner(core: int) -> subprocess.Popen:
    """A child process spinning on `core` (Linux affinity; elsewhere it spins wherever the OS puts it)."""
    pin = (lambda: os.sched_setaffinity(0, {core})) if hasattr(os, "sched_setaffinity") else None
    return subprocess.Popen([sys.executable, "-c", SPIN], preexec_fn=pin)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--pos", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    path = smollm2_path()
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, attn_implementation="sdpa",
                                              dtype=dtype).eval()
    model = resid.load("smollm2-135m", dtype=dtype)
    ids = torch.randint(0, model.config.d_vocab, (args.batch, args.pos), generator=torch.Generator().manual_seed(0))
    cases = {
        "resid": lambda: model.run(ids, capture=resid.Capture.none()),
        "transformers": lambda: hf(ids, use_cache=False),
    }
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count()))
    print(f"torch {torch.__version__}, {args.threads} threads on cores {cores}, {args.dtype}, "
          f"{args.batch} x {args.pos} tokens, median of {args.repeats}; resid from {os.path.dirname(resid.__file__)}")
    with torch.no_grad():
        diff = (hf(ids, use_cache=False).logits.float() - model.run(ids, capture=resid.Capture.none()).logits.float()
                ).abs().max().item()
        for fn in cases.values():  # warm-up
            fn()
        quiet = measure(cases, args.repeats)
        spin = spinner(cores[-1])
        try:
            time.sleep(0.5)  # let it start spinning
            busy = measure(cases, args.repeats)
        finally:
            spin.kill()
            spin.wait()
    print(f"max |logit diff| resid vs transformers: {diff:.2e}")
    print(f"{'':<14}{'quiet ms':>10}{'busy ms':>10}{'busy/quiet':>12}")
    for name in cases:
        print(f"{name:<14}{quiet[name]:>10.1f}{busy[name]:>10.1f}{busy[name] / quiet[name]:>11.2f}x")
    print(f"resid / transformers: quiet {quiet['resid'] / quiet['transformers']:.2f}x, "
          f"busy {busy['resid'] / busy['transformers']:.2f}x")


if __name__ == "__main__":
    main()
