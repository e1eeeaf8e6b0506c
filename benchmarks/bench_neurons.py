"""Neuron-inspection benchmark on SmolLM2-135M (30 layers x 1536 neurons, vocab 49152), in one process.

    python benchmarks/bench_neurons.py [--docs 200] [--window 256] [--repeats 2] [--skip-values]

1. neurons.value_top_tokens for all 46,080 neurons, k=20: wall time, peak resident-memory growth during
   the call (sampled every 5 ms by a psutil thread; ru_maxrss growth if psutil is missing) and the
   analytic working set (the folded unembedding, one [chunk d_vocab] logit block, the result table).
2. top_activating's streaming scan (resid.analyses.neurons.scan: forward + running top-k, no table) against a plain
   forward on the very same padded batches of the demo corpus, repeats interleaved:
     plain      model.run(batch, capture=Capture.none())                  (logits at every position)
     plain_last model.run(batch, capture=Capture.none(), logits_at="last")
     scan_1     scan over layer 20, all 1536 neurons, k=20
     scan_30    scan over all 30 layers, all neurons, k=20
   The issue's target is scan tokens/s >= 0.8x plain tokens/s. End-to-end top_activating (tokenizing,
   scanning and building the table of contexts) is timed once for each layer set.
"""

import argparse
import resource
import statistics
import threading
import time

import torch

import resid
from resid.analyses import Execution, corpus, neurons
from resid.analyses.corpus_windows import batch_tokens, cut_windows
from resid.analyses.neurons.scan import scan
from resid.analyses.neurons.values import CHUNK_BYTES


class PeakRSS:
    """Peak resident memory growth (bytes) inside a `with` block."""

    def __enter__(self):
        try:
            import psutil
        except ImportError:
            self.process = None
            self.start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            return self
        self.process = psutil.Process()
        self.start = self.peak = self.process.memory_info().rss
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while self.running:
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.005)

    def __exit__(self, *exc):
        if self.process is None:
            self.growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.start
            self.method = "ru_maxrss growth (a lower bound if an earlier peak was higher)"
        else:
            self.running = False
            self.thread.join()
            self.growth = self.peak - self.start
            self.method = "psutil RSS sampled every 5 ms"


def bench_values(model) -> None:
    cfg = model.config
    with PeakRSS() as memory:
        start = time.perf_counter()
        df = neurons.value_top_tokens(model, k=20)
        seconds = time.perf_counter() - start
    rows = max(1, CHUNK_BYTES // (4 * cfg.d_vocab))
    unembed, block = 4 * cfg.d_model * cfg.d_vocab, 4 * rows * cfg.d_vocab
    table = df.memory_usage(deep=True).sum()
    print(f"value_top_tokens: {cfg.n_layers * cfg.d_mlp} neurons x k=20 (top and bottom) -> {len(df):,} rows")
    print(f"  time {seconds:.1f} s   peak RSS growth {memory.growth / 2**20:.0f} MiB ({memory.method})")
    print(f"  analytic: unembedding {unembed / 2**20:.0f} MiB + logit block {block / 2**20:.0f} MiB "
          f"({rows} neurons) + table {table / 2**20:.0f} MiB")


def bench_scan(model, texts, window: int, repeats: int) -> None:
    pieces = cut_windows(model, texts, window)
    width = len(pieces[0])
    rows = max(1, 4096 // width)  # what batch_size="auto" picks on a CPU; passed explicitly to every side
    batches = [batch_tokens(pieces[i : i + rows], model.tokenizer.pad_token_id, model.device)[0]
               for i in range(0, len(pieces), rows)]
    n_tokens = sum(len(w) for w in pieces)
    print(f"\ncorpus: {len(texts)} documents, {len(pieces)} windows, {n_tokens:,} tokens, "
          f"{len(batches)} batches of {rows} windows (<= {width} tokens)")
    all_layers = list(range(model.config.n_layers))
    quiet = Execution(batch_size=rows, progress=False)
    sides = {
        "plain": lambda: [model.run(b, capture=resid.Capture.none()) for b in batches],
        "plain_last": lambda: [model.run(b, capture=resid.Capture.none(), logits_at="last") for b in batches],
        "scan_1": lambda: scan(model, pieces, [20], None, 20, execution=quiet),
        "scan_30": lambda: scan(model, pieces, all_layers, None, 20, execution=quiet),
    }
    times = {name: [] for name in sides}
    model.run(batches[-1], capture=resid.Capture.none())  # warm-up
    for _ in range(repeats):
        for name, work in sides.items():
            start = time.perf_counter()
            work()
            times[name].append(time.perf_counter() - start)
    plain = statistics.median(times["plain"])
    print(f"{'':<11}{'median s':>9}{'tokens/s':>10}{'vs plain':>10}{'vs plain_last':>15}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<11}{median:>9.2f}{n_tokens / median:>10.0f}{plain / median:>9.2f}x"
              f"{statistics.median(times['plain_last']) / median:>14.2f}x")
    for label, layers in (("1 layer", [20]), ("30 layers", None)):
        start = time.perf_counter()
        df = neurons.top_activating(model, texts, layers, k=20, window=window,
                                    execution=Execution(batch_size=rows, progress=False))
        seconds = time.perf_counter() - start
        print(f"top_activating end to end, {label}: {seconds:.1f} s ({n_tokens / seconds:.0f} tokens/s, "
              f"{plain / seconds:.2f}x plain) -> {len(df):,} rows")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=200, help="demo-corpus documents (paragraphs)")
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-values", action="store_true")
    args = parser.parse_args()
    model = resid.load("smollm2-135m")
    print(f"SmolLM2-135M on {model.device}, {model.dtype}, torch threads {torch.get_num_threads()}\n")
    if not args.skip_values:
        bench_values(model)
    bench_scan(model, corpus.demo(max_documents=args.docs), args.window, args.repeats)


if __name__ == "__main__":
    main()
