"""Training throughput on SmolLM2-135M (d_model 576, 30 layers): a TopK SAE (8x expansion, k=32) at one layer.

    python benchmarks/bench_train.py [--layer 15] [--steps 8] [--batch-size 4096] [--window 256] [--device cpu]
                                     [--transcoders]

1. generate   activation generation alone: the demo corpus through the model in padded batches, the hook read
              at every real non-BOS token, shuffled (resid.analyses.training.activations): tokens/s
2. train      the SAE's optimizer steps alone on those activations (resid.analyses.training.trainer): tokens/s
3. end to end resid.analyses.training.train for --steps steps (generation + training, one stream): tokens/s
4. --transcoders: one forward pass reading all 30 layers' transcoder hooks (MLP standardized input and MLP write)
   against one layer's, as the cost of 30 transcoders from one forward vs 30 separate runs' generation.

Not measured yet: SAELens's trainer on the same tokens (SAELens is not installed here, offline); the issue's
comparison (>= 2x SAELens tokens/s at FVU within 5%) is left for a machine with SAELens.
"""

import argparse
import time

import torch

import resid
from resid.analyses import corpus
from resid.analyses.training.activations import Activations
from resid.analyses.training.loop import Spec, train
from resid.analyses.training.recipe import Recipe
from resid.analyses.training.trainer import Trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layer", type=int, default=15)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--forward-batch", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--transcoders", action="store_true")
    args = parser.parse_args()

    model = resid.load("smollm2-135m", device=args.device)
    texts = corpus.demo(max_documents=2000)
    hook = f"blocks.{args.layer}.hook_resid_post"
    buffer_tokens = (args.steps + 1) * args.batch_size
    recipe = Recipe(activation="topk", expansion=8, k=32, steps=args.steps, batch_size=args.batch_size,
                    warmup_steps=1)
    print(f"SmolLM2-135M on {args.device}, {torch.get_num_threads()} threads; TopK SAE 8x (d_sae 4608) k=32 at {hook}; "
          f"batch {args.batch_size} tokens, windows of {args.window}, {args.forward_batch} windows per forward")

    source = Activations(model, texts, [hook], args.batch_size, args.window, args.forward_batch, buffer_tokens)
    start = time.perf_counter()
    block = source.block(0)[hook]
    _sync(args.device)
    generate = time.perf_counter() - start
    print(f"generate   {len(block):>8} tokens in {generate:7.2f} s: {len(block) / generate:9.0f} tokens/s")

    trainer = Trainer.new(recipe, model.config.d_model, device=args.device)
    n = min(args.steps, len(block) // args.batch_size)
    trainer.step(block[:args.batch_size])  # warm-up step (b_dec's geometric median, allocations)
    _sync(args.device)
    start = time.perf_counter()
    for i in range(n):
        stats = trainer.step(block[i * args.batch_size:(i + 1) * args.batch_size])
    _sync(args.device)
    steps = time.perf_counter() - start
    print(f"train      {n * args.batch_size:>8} tokens in {steps:7.2f} s: {n * args.batch_size / steps:9.0f} tokens/s "
          f"(last step: FVU {stats.fvu:.3f}, L0 {stats.l0:.1f})")

    start = time.perf_counter()
    train(model, texts, [hook], recipe, window=args.window, forward_batch=args.forward_batch,
          buffer_tokens=buffer_tokens, progress=False, device=args.device)
    _sync(args.device)
    total = time.perf_counter() - start
    tokens = args.steps * args.batch_size
    print(f"end to end {tokens:>8} tokens in {total:7.2f} s: {tokens / total:9.0f} tokens/s")

    if args.transcoders:
        every = [h for layer in range(model.config.n_layers) for h in
                 (Spec.transcoder(model, layer).hook_in, Spec.transcoder(model, layer).hook_out)]
        timings = {}
        for label, hooks in (("1 layer", every[:2]), ("30 layers", every)):
            source = Activations(model, texts, hooks, args.batch_size, args.window, args.forward_batch, args.batch_size)
            start = time.perf_counter()
            found = source.block(0)
            _sync(args.device)
            timings[label] = time.perf_counter() - start
            print(f"transcoder hooks, {label:9}: {len(found[hooks[0]]):>7} tokens in {timings[label]:6.2f} s")
        print(f"30 transcoders from one forward: {timings['30 layers'] / (30 * timings['1 layer']):.2f}x the "
              "generation time of 30 separate runs")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
