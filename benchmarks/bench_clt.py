"""Cross-layer transcoder training throughput against the per-layer transcoders' own trainer, on SmolLM2-135M's
shapes (30 layers, d_model 576): the optimizer steps alone, on the same synthetic batches, side by side.

    python benchmarks/bench_clt.py [--layers 30] [--d-model 576] [--expansion 2] [--k 16] [--batch-size 2048]
                                   [--steps 3] [--threads 2] [--decode-clt-python build/decode-clt-venv/bin/python]

Cases, one step of each per round (interleaved, so drift on a shared machine hits all alike), median over --steps
rounds after one warm-up step:

    per-layer    one BatchTopK transcoder per layer (resid.analyses.training, Spec.transcoder's recipe), each
                 stepping on its layer's rows: what `resid train-transcoder --layers all` runs per batch
    clt          the CLT (resid.analyses.training.crosslayer, BatchTopK per layer), its decoders reading only the
                 kept entries' rows (decode_sparse)
    clt-dense    the same CLT decoding every feature densely (what decode_sparse saves)

Each at --expansion x d_model features per layer, k per token and layer. The multiply-add bound of a step is its
products at this machine's dense matmul rate at one layer's encoder shape (a plain torch.mm of [batch d_model] @
[d_model features], measured in the same run; the 2048^3 rate of benchmarks/timing.matmul_gflops is printed
beside it), forward and the two backward products (3x the forward's multiply-adds):

    encoders       tokens x layers x d_in x features                        (both)
    decoders       tokens x layers x k x d_out                              per-layer
                   tokens x k x d_out x layers (layers + 1) / 2             clt (sparse)
                   tokens x features x d_out x layers (layers + 1) / 2      clt-dense

Adam updates every weight each step, however sparse the batch: its time is measured alone (optimizer.step on the
CLT's weights) and printed beside the bound, which it is not part of. Synthetic Gaussian batches: BatchTopK keeps k x
tokens entries whatever the data, so the work is the same as on real activations.

--decode-clt-python: the `decode-clt` package (PyPI, curt-tigges/crosslayer-coding; `python -m venv ENV &&
ENV/bin/pip install decode-clt torch==2.13.0`) in its own environment, its CrossLayerTranscoder's training step on
the same shapes (benchmarks/decode_clt_step.py, run there), printed after resid's: a separate process, so not
interleaved.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from timing import matmul_gflops

from resid.analyses.training.crosslayer import CrossLayerCoder
from resid.analyses.training.recipe import Recipe
from resid.analyses.training.trainer import Trainer


class DenseDecodeCLT(CrossLayerCoder):
    """The CLT decoding its BatchTopK activations densely (the decode before decode_sparse), for the comparison."""

    def decode_sparse(self, kept, tokens):
        acts = torch.zeros(tokens, self.n_layers, self.d_sae)
        for layer, (values, token, feature) in enumerate(kept):
            acts[:, layer] = acts[:, layer].index_put((token, feature), values)
        return self.decode(acts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--d-model", type=int, default=576)
    parser.add_argument("--expansion", type=int, default=2)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-dense", action="store_true", help="skip clt-dense (the slowest case)")
    parser.add_argument("--decode-clt-python", default=None, help="python of an environment with decode-clt")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    n, d, b = args.layers, args.d_model, args.batch_size
    f = args.expansion * d
    recipe = Recipe(activation="batchtopk", k=args.k, d_sae=f, batch_size=b, steps=args.steps + 1, warmup_steps=0,
                    normalize="none")
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(b, n, d, generator=g), torch.randn(b, n, d, generator=g)
    per_layer = [Trainer.new(recipe, d, d, transcoder=True) for _ in range(n)]
    cases = {"per-layer": lambda: [t.step(x[:, layer], y[:, layer]) for layer, t in enumerate(per_layer)]}
    clt = Trainer(CrossLayerCoder(n, d, d, recipe))
    cases["clt"] = lambda: clt.step(x, y)
    if not args.no_dense:
        dense = Trainer(DenseDecodeCLT(n, d, d, recipe))
        cases["clt-dense"] = lambda: dense.step(x, y)
    times = {name: [] for name in cases}
    for round_ in range(args.steps + 1):
        for name, fn in cases.items():
            start = time.perf_counter()
            fn()
            if round_:  # the first round warms up
                times[name].append(time.perf_counter() - start)
    seconds = {name: statistics.median(t) for name, t in times.items()}
    adam = _adam_seconds(clt, args.steps)
    square = matmul_gflops()
    rate = _encoder_gflops(b, d, f, args.steps)
    blocks = n * (n + 1) // 2
    encoder = b * n * d * f
    macs = {"per-layer": encoder + b * n * args.k * d, "clt": encoder + b * args.k * d * blocks,
            "clt-dense": encoder + b * f * d * blocks}
    params = {"per-layer": sum(p.numel() for t in per_layer for p in t.coder.parameters()),
              "clt": sum(p.numel() for p in clt.coder.parameters())}
    params["clt-dense"] = params["clt"]
    print(f"{n} layers, d_model {d}, {f:,} features per layer, k={args.k}, batch {b:,} tokens, {args.threads} "
          f"threads; dense matmul {rate:.0f} GFLOP/s at one layer's encoder shape ({b} x {d} @ {d} x {f}; 2048^3: "
          f"{square:.0f}), the bound's rate; Adam's step on the CLT's {params['clt'] / 1e6:.0f}M weights alone: "
          f"{adam:.3f} s")
    print(f"{'case':<10} {'s/step':>8} {'tokens/s':>9} {'weights':>9} {'GFLOP/step':>11} {'bound s':>8} "
          f"{'of bound':>9}")
    for name, s in seconds.items():
        flops = 2 * 3 * macs[name]
        bound = flops / rate / 1e9
        print(f"{name:<10} {s:8.3f} {b / s:9,.0f} {params[name] / 1e6:8.0f}M {flops / 1e9:11.1f} {bound:8.3f} "
              f"{bound / s:9.1%}")
    print(f"clt / per-layer tokens/s: {seconds['per-layer'] / seconds['clt']:.3f}"
          + (f"; clt sparse / dense decode: {seconds['clt-dense'] / seconds['clt']:.2f}x" if "clt-dense" in seconds
             else ""))
    if args.decode_clt_python:
        found = subprocess.run([args.decode_clt_python, str(Path(__file__).with_name("decode_clt_step.py")),
                                json.dumps({"layers": n, "d_model": d, "features": f, "k": args.k, "batch_size": b,
                                            "steps": args.steps, "threads": args.threads})],
                               capture_output=True, text=True)
        if found.returncode:
            sys.exit(f"decode-clt's step failed:\n{found.stderr[-3000:]}")
        theirs = json.loads(found.stdout.strip().splitlines()[-1])
        print(f"decode-clt {theirs['version']} ({theirs['activation']}): {theirs['seconds']:.3f} s/step, "
              f"{b / theirs['seconds']:,.0f} tokens/s; resid's clt / decode-clt: "
              f"{theirs['seconds'] / seconds['clt']:.2f}x (separate processes, run one after the other)")


def _encoder_gflops(tokens: int, d: int, features: int, steps: int) -> float:
    """This machine's matmul rate at one layer's encoder product, [tokens d] @ [d features], measured in this run
    (median of steps + 1 products after one warm-up): the bound's rate, at the shapes the step multiplies."""
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(tokens, d, generator=g), torch.randn(d, features, generator=g)
    times = []
    for _ in range(steps + 2):
        start = time.perf_counter()
        torch.mm(x, w)
        times.append(time.perf_counter() - start)
    return 2 * tokens * d * features / statistics.median(times[1:]) / 1e9


def _adam_seconds(trainer: Trainer, steps: int) -> float:
    """Median time of the optimizer's step alone on the CLT's weights (gradients of ones, lr 0: nothing moves)."""
    for p in trainer.coder.parameters():
        p.grad = torch.ones_like(p)
    for group in trainer.optimizer.param_groups:
        group["lr"] = 0.0
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        trainer.optimizer.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


if __name__ == "__main__":
    main()
