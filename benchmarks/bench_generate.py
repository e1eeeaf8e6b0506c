"""Generation benchmark on SmolLM2-135M: time per generated token with the KV cache vs re-running the growing
sequence (no cache), each with and without a steering vector (Add at one attention write, every position).

    python benchmarks/bench_generate.py [--threads 2] [--new 16] [--repeats 10] [--layer 6]

Each forward pass is timed on its own (from one call of the token embedding to the next), and the prompt's pass
is left out, so the time per token is that of the passes that produce tokens 2..new. One new token reads every
weight once, so a cached step is bound by memory bandwidth, which other processes on a shared machine take away:
runs alternate between the variants so that a slow spell hits all of them alike, each step keeps its fastest
repeat (the least disturbed), and the printed time per token is the mean of those over the steps.
Target (generation issue): with an intervention <= 1.1x without.
"""

import argparse
import time

import torch

import resid

PROMPT = "The Eiffel Tower is located in Paris. In the morning, the tourists who had come to see it"


def uncached(model: resid.Transformer, tokens: resid.Tokens, n_new: int, interventions) -> torch.Tensor:
    """Greedy generation without a cache: the whole sequence runs again for every new token."""
    ids = tokens.ids
    for _ in range(n_new):
        logits = model.run(ids, capture=resid.Capture.none(), interventions=interventions, logits_at="last").logits
        ids = torch.cat([ids, logits[:, 0].argmax(dim=-1, keepdim=True)], dim=1)
    return ids[:, tokens.ids.shape[1] :]


def cached(model: resid.Transformer, tokens: resid.Tokens, n_new: int, interventions) -> torch.Tensor:
    return model.generate(tokens, n_new, interventions=interventions).new_ids


def step_seconds(model: resid.Transformer, fn) -> list[float]:
    """Durations of the forward passes after the first (the prompt's) that `fn` runs."""
    stamps = []
    handle = model.embed.register_forward_pre_hook(lambda *_: stamps.append(time.perf_counter()))
    try:
        fn()
    finally:
        handle.remove()
    stamps.append(time.perf_counter())
    return [end - start for start, end in zip(stamps[1:-1], stamps[2:])]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--layer", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = resid.load("smollm2-135m")
    tokens = model.to_tokens(PROMPT)
    vector = torch.randn(model.config.d_model, generator=torch.Generator().manual_seed(0))
    steer = [resid.Add(resid.Site(args.layer, "attn"), 4.0 * vector / vector.norm())]
    variants = {
        ("cache", "clean"): (cached, ()),
        ("cache", "steered"): (cached, steer),
        ("no cache", "clean"): (uncached, ()),
        ("no cache", "steered"): (uncached, steer),
    }
    for fn, ivs in variants.values():  # warm-up, and the two paths must agree on the tokens
        fn(model, tokens, 2, ivs)
    agree = {
        kind: torch.equal(cached(model, tokens, args.new, ivs), uncached(model, tokens, args.new, ivs))
        for kind, ivs in (("clean", ()), ("steered", steer))
    }
    steps = {key: [] for key in variants}
    for _ in range(args.repeats):
        for key, (fn, ivs) in variants.items():
            steps[key].append(step_seconds(model, lambda: fn(model, tokens, args.new, ivs)))
    fastest = {key: torch.tensor(runs).min(dim=0).values for key, runs in steps.items()}
    ms = {key: 1e3 * float(times.mean()) for key, times in fastest.items()}
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {model.name}, "
          f"prompt {tokens.ids.shape[1]} tokens, {args.new} new tokens, fastest of {args.repeats} per step")
    print(f"same tokens with and without the cache: clean {agree['clean']}, steered {agree['steered']}")
    print(f"{'ms per new token':<18}{'clean':>10}{'steered':>10}{'steered/clean':>15}")
    for path in ("cache", "no cache"):
        clean, steered = ms[(path, "clean")], ms[(path, "steered")]
        print(f"{path:<18}{clean:>10.2f}{steered:>10.2f}{steered / clean:>14.3f}x")
    speedup = [ms[("no cache", kind)] / ms[("cache", kind)] for kind in ("clean", "steered")]
    print(f"{'no cache/cache':<18}{speedup[0]:>9.2f}x{speedup[1]:>9.2f}x")
    met = ms[("cache", "steered")] <= 1.1 * ms[("cache", "clean")]
    print(f"target: steered/clean <= 1.1x with the cache: {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
