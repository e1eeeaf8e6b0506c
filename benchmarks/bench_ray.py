"""Scale-out benchmark: an ablation sweep and a corpus scan in process vs on Ray workers, same weights, same inputs.

    python benchmarks/bench_ray.py [--prompts 32] [--docs 2000] [--layers 20|all] [--repeats 1]

Work (SmolLM2-135M, the embedded default):
  sweep   resid.analyses.ablation.sweep(..., sites="sublayer", method="zero", metric="logit_diff") over the IOI prompts
          of bench_ablation.py (one token length)
  scan    resid.analyses.neurons.top_activating over the first `--docs` paragraphs of the demo corpus, k=20
Cases, each run once on a small slice first (warm-up), then `--repeats` rounds interleaved:
  inproc_1t   in process, torch.set_num_threads(1)                      (the baseline)
  inproc_2t   in process, 2 threads                                      (reference)
  ray_1w      RayExecutor(workers=1), one torch thread per worker
  ray_2w      RayExecutor(workers=2), one torch thread per worker
Prints each case's agreement with inproc_1t, median wall time of the work (the Ray cluster and its actors are
started before the rounds), speed-ups against inproc_1t with the targets (2 workers >= 1.7x on work over a minute,
1 worker within 10% of in process), the fixed start-up cost (ray.init + actors loading the model; target < 10 s)
and the per-chunk costs of the 1-worker run (chunks run one after another there), from which a run on N GPUs
is about start-up + ceil(chunks / N) x seconds per chunk, with 4 x N chunks (resid.analyses.sweeps.chunks).
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import argparse
import statistics
import time
from collections.abc import Callable, Iterator, Sequence

import pandas as pd
import torch
from bench_ablation import make_prompts

import resid
from resid.analyses import Execution, ablation, corpus, neurons
from resid.analyses.distributed import Executor, InProcess, Job, RayExecutor

TARGETS = {"ray_2w": (1.7, "2 workers >= 1.7x one in-process thread"), "ray_1w": (0.9, "1 worker within 10%")}


class Timed(Executor):
    """Another executor, recording when each chunk's result arrived (seconds from the start of map)."""

    def __init__(self, inner: Executor):
        self.inner, self.arrivals = inner, {}

    @property
    def workers(self) -> int:
        return self.inner.workers

    def map(self, model, job: Job, chunks: Sequence[object]) -> Iterator[tuple[int, object]]:
        began, self.arrivals, self.chunks = time.perf_counter(), {}, chunks
        for index, result in self.inner.map(model, job, chunks):
            self.arrivals[index] = time.perf_counter() - began
            yield index, result


def threads(n: int, fn: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        torch.set_num_threads(n)
        return fn()

    return run


def rounds(cases: dict[str, Callable[[], object]], repeats: int) -> tuple[dict[str, float], dict[str, object]]:
    """Median wall time of each case over `repeats` interleaved rounds, and each case's last result."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    results: dict[str, object] = {}
    for _ in range(repeats):
        for name, fn in cases.items():
            start = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}, results


def report(title: str, median: dict[str, float], results: dict[str, pd.DataFrame], unit: str, amount: int) -> None:
    base = median["inproc_1t"]
    print(f"\n{title}")
    for name, frame in results.items():
        gap = (frame.select_dtypes("float").to_numpy() - results["inproc_1t"].select_dtypes("float").to_numpy())
        print(f"  {name}: {len(frame)} rows, max |value - inproc_1t| = {abs(gap).max() if gap.size else 0:.1e}")
    print(f"  {'case':<11}{'s':>9}{unit + '/s':>12}{'x inproc_1t':>13}   target")
    for name, seconds in median.items():
        target, label = TARGETS.get(name, (None, ""))
        verdict = "" if target is None else f"{label}: {'met' if base / seconds >= target else 'NOT met'}"
        verdict += " (work under a minute: not the target's regime)" if target and base < 60 else ""
        print(f"  {name:<11}{seconds:>9.2f}{amount / seconds:>12.1f}{base / seconds:>12.2f}x   {verdict}")


def per_chunk(timed: Timed, what: str, sizes: list[int]) -> None:
    """Seconds per chunk of the 1-worker run, from the gaps between arrivals (chunks run one after another)."""
    arrivals = sorted(timed.arrivals.values())
    gaps = [b - a for a, b in zip([0.0, *arrivals], arrivals)]
    print(f"  per chunk (ray_1w, one worker): {len(sizes)} {what}s, {statistics.mean(sizes):.0f} "
          f"{'rows' if what == 'chunk' else 'tokens'} per {what} (min {min(sizes)}, max {max(sizes)}), "
          f"{statistics.median(gaps):.2f} s per {what} (median; first {gaps[0]:.2f} s, last {gaps[-1]:.2f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--layers", default="20", help="scan layers: '20', '0,20' or 'all'")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    layers = None if args.layers == "all" else [int(x) for x in args.layers.split(",")]
    model = resid.load("smollm2-135m")
    prompts, targets, baselines = make_prompts(model, args.prompts)
    texts = corpus.demo(max_documents=args.docs)
    n_tokens = sum(len(ids) for ids in model.require_tokenizer().tokenizer.encode_batch(texts))
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; sweep: {len(prompts)} "
          f"prompts x 60 sublayer sites; scan: {len(texts)} documents, ~{n_tokens:,} tokens, layers {args.layers}")

    import ray

    began = time.perf_counter()
    ray.init(num_cpus=3, include_dashboard=False, logging_level="WARNING")  # 3 actors, 2 of them busy at once
    init = time.perf_counter() - began
    two, one = RayExecutor(workers=2), RayExecutor(workers=1)
    start_two = two.start(model)
    start_one = one.start(model)
    print(f"start-up: ray.init {init:.1f} s + 2 actors loading the model {start_two:.1f} s = {init + start_two:.1f} s "
          f"(target < 10 s; 1 actor: {start_one:.1f} s)")
    executors = {"inproc_1t": (1, InProcess()), "inproc_2t": (2, InProcess()), "ray_1w": (1, Timed(one)),
                 "ray_2w": (1, Timed(two))}
    torch_threads = torch.get_num_threads()

    def sweep_case(n: int, executor: Executor, count: int) -> Callable[[], pd.DataFrame]:
        return threads(n, lambda: ablation.sweep(model, prompts[:count], targets[:count], baselines[:count],
                                                 sites="sublayer",
                                                 execution=Execution(executor=executor, progress=False)))

    def scan_case(n: int, executor: Executor, count: int) -> Callable[[], pd.DataFrame]:
        return threads(n, lambda: neurons.top_activating(model, texts[:count], layers, k=20,
                                                         execution=Execution(executor=executor, progress=False)))

    for title, case, amount, unit, full, what in (
        ("ablation sweep (sublayer, zero, logit_diff)", sweep_case, len(prompts) * 60, "rows", len(prompts), "chunk"),
        ("top-activating scan (k=20)", scan_case, n_tokens, "tok", len(texts), "shard"),
    ):
        for n, executor in executors.values():
            case(n, executor, min(full, 2 if what == "chunk" else 20))()  # warm-up on a slice
        median, results = rounds({name: case(n, ex, full) for name, (n, ex) in executors.items()}, args.repeats)
        torch.set_num_threads(torch_threads)
        report(title, median, results, unit, amount)
        timed = executors["ray_1w"][1]
        if what == "chunk":
            sizes = [len(chunk.rows) for chunk in timed.chunks]
        else:
            sizes = [sum(len(w) for w in shard.windows) for shard in timed.chunks]
        per_chunk(timed, what, sizes)
        arrivals = sorted(executors["ray_2w"][1].arrivals.values())
        print(f"  ray_2w: {len(arrivals)} {what}s, results at " + ", ".join(f"{a:.1f}" for a in arrivals[:8])
              + (" ..." if len(arrivals) > 8 else "") + " s (the spread shows how evenly the two workers were loaded)")
    one.close()
    two.close()


if __name__ == "__main__":
    main()
