"""Patching benchmark: exact head patching with resid's engine vs TransformerLens's hook loop, and attribution
patching (AtP) over every site vs one forward pass, SmolLM2-135M, IOI pairs, one process, same weights.

    python benchmarks/bench_patching.py [--pairs 32] [--tl bridge|none]

Pairs: the IOI prompts of bench_ablation.py (one token length, no padding), clean "When A and B went to the
place, B gave an obj to" -> " A" (baseline " B"), corrupt the same with A at the second mention (the names
swapped there), metric logit(A) - logit(B) at the last token, denoising (clean z patched into the corrupt run).
  resid_exact   resid.analyses.patching.activation(..., sites="head"): every head (30 x 9), resumed from the corrupt
                prefix, the last token unembedded
  tl_loop       TransformerLens 4.3 TransformerBridge: run_with_cache on the clean prompts, then per head one
                run_with_hooks on the corrupt prompts replacing that head's hook_z
  resid_atp     resid.analyses.patching.atp(..., sites=ALL): residual stream (layer x position), every
                attention / MLP write and every head, from one run of each side and one backward
  resid_atp*    the same with method="atp*" (queries and keys through the exact new pattern; GradDrop: one
                more backward pass per layer), ranked by its magnitude estimates
  keys          exact, AtP and AtP* patching of every key head (30 x 3): where the query / key fix shows
  forward       one plain resid forward of the corrupt prompts (the unit of the AtP target)
The multiply-add bound of exact patching: a head patched at layer l reruns layers l..29 at every position plus
the last token's unembedding; at the plain forward's measured multiply-add rate that takes bound_s. Prints the
agreement of resid and TL (max |difference| of the patched metrics), the times, and AtP's top-20 heads vs
the exact top-20.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import argparse
import time

import torch
from bench_ablation import load_tl, logit_diff, make_prompts

import resid
from resid.analyses import Execution, patching

ALL = ["resid_pre", "sublayer", "head"]  # what resid_atp estimates from one backward pass
QUIET = Execution(progress=False)  # no bar in the timings, on a terminal or not


def corrupt_of(prompts: list[str], targets: list[str], baselines: list[str]) -> list[str]:
    """Each prompt with the second mention of the baseline name (B) replaced by the target name (A)."""
    out = []
    for text, a, b in zip(prompts, targets, baselines):
        head, _, tail = text.rpartition(b.strip())
        out.append(head + a.strip() + tail)
    return out


def macs_per_token(config, layers: int, unembed: bool) -> float:
    d, d_mlp, heads, kv, d_head = config.d_model, config.d_mlp, config.n_heads, config.n_kv_heads, config.d_head
    per_layer = d * (heads + 2 * kv) * d_head + heads * d_head * d + 3 * d * d_mlp
    return layers * per_layer + (d * config.d_vocab if unembed else 0)


def timed(fn, repeats: int = 1) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=32)
    parser.add_argument("--tl", choices=["bridge", "none"], default="bridge")
    args = parser.parse_args()
    model = resid.load("smollm2-135m")
    clean, targets, baselines = make_prompts(model, args.pairs)
    corrupt = corrupt_of(clean, targets, baselines)
    ids_clean, ids_corrupt = model.to_tokens(clean).ids, model.to_tokens(corrupt).ids
    n_pos, config = ids_clean.shape[1], model.config
    target_ids = torch.tensor([model.to_single_token(t) for t in targets])
    baseline_ids = torch.tensor([model.to_single_token(b) for b in baselines])
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}; {args.pairs} pairs x {n_pos} tokens, "
          f"e.g. {clean[0]!r} / {corrupt[0]!r}")

    with torch.no_grad():
        forward_s, _ = timed(lambda: model(ids_corrupt), repeats=5)
    full = macs_per_token(config, config.n_layers, unembed=False) * n_pos + macs_per_token(config, 0, True) * n_pos
    rate = args.pairs * full / forward_s
    exact_macs = sum(macs_per_token(config, config.n_layers - l, False) * n_pos + macs_per_token(config, 0, True)
                     for l in range(config.n_layers)) * config.n_heads * args.pairs
    bound_s = exact_macs / rate

    exact_s, exact = timed(lambda: patching.activation(model, clean, corrupt, targets, baselines, sites="head",
                                                       execution=QUIET))
    atp_s, estimate = timed(lambda: patching.atp(model, clean, corrupt, targets, baselines, sites=ALL,
                                                 execution=QUIET), repeats=3)
    heads = estimate[estimate["head"].notna()]
    agreement = patching.compare(heads, exact, k=20)
    star_s, star = timed(lambda: patching.atp(model, clean, corrupt, targets, baselines, sites=ALL, method="atp*",
                                              execution=QUIET))
    star_agreement = patching.compare(star[star["head"].notna()], exact, k=20)
    sizes = patching.compare(heads, exact, k=20, by="magnitude")
    print(f"forward (corrupt prompts)      {forward_s * 1000:9.1f} ms")
    print(f"resid_exact, {config.n_layers * config.n_heads} heads        {exact_s:9.2f} s   multiply-add bound "
          f"{bound_s:.2f} s ({exact_s / bound_s:.2f}x the bound)")
    print(f"resid_atp, {len(estimate) // args.pairs} sites per pair   {atp_s:9.2f} s   "
          f"{atp_s / forward_s:.2f}x one forward")
    print(f"AtP vs exact heads: Spearman {agreement['spearman']:.3f}, top-20 overlap "
          f"{round(agreement['top_k_overlap'] * 20)}/20, missed {agreement['false_negatives']}")
    print(f"resid_atp*, same sites          {star_s:9.2f} s   {star_s / forward_s:.2f}x one forward")
    for name, scored in (("AtP |effect|", sizes), ("AtP* magnitude", star_agreement)):
        print(f"{name:>14} vs exact |effect| of heads: Spearman {scored['spearman']:.3f}, top-20 overlap "
              f"{round(scored['top_k_overlap'] * 20)}/20, missed {scored['false_negatives']}")
    keys_s, keys = timed(lambda: patching.activation(model, clean, corrupt, targets, baselines, sites="k",
                                                     execution=QUIET))
    print(f"exact key patching, {len(keys) // args.pairs} key heads  {keys_s:9.2f} s")
    for method in ("atp", "atp*"):
        guess = patching.atp(model, clean, corrupt, targets, baselines, sites="k", method=method, execution=QUIET)
        scored = patching.compare(guess, keys, k=10, by="magnitude")
        print(f"{method:>5} vs exact keys (by size): Spearman {scored['spearman']:.3f}, top-10 overlap "
              f"{round(scored['top_k_overlap'] * 10)}/10")

    if args.tl == "bridge":
        bridges = load_tl("bridge")
        if bridges:
            bridge = bridges["tl_bridge"]
            exact_metric = torch.tensor(exact.sort_values(["prompt_idx", "layer", "head"])["patched_metric"].to_numpy())

            def tl_loop() -> torch.Tensor:
                with torch.no_grad():
                    _, cache = bridge.run_with_cache(ids_clean, names_filter=lambda name: name.endswith("hook_z"))
                    results = []
                    for layer in range(config.n_layers):
                        clean_z = cache[f"blocks.{layer}.attn.hook_z"]
                        for head in range(config.n_heads):
                            def patch(z, hook, head=head, clean_z=clean_z):
                                z[:, :, head] = clean_z[:, :, head]
                                return z

                            hooks = [(f"blocks.{layer}.attn.hook_z", patch)]
                            logits = bridge.run_with_hooks(ids_corrupt, fwd_hooks=hooks)
                            results.append(logit_diff(logits[:, -1], target_ids, baseline_ids))
                    return torch.stack(results).T.reshape(-1)  # [pair (layer head)]

            tl_s, tl_metric = timed(tl_loop)
            gap = (tl_metric.double() - exact_metric).abs().max().item()
            print(f"tl_loop, {config.n_layers * config.n_heads} heads            {tl_s:9.2f} s   resid_exact is "
                  f"{tl_s / exact_s:.2f}x faster; max |patched metric difference| {gap:.2e}")
    print(f"targets: exact within 10% of its bound ({exact_s / bound_s:.2f}x) and >= 2x TL; AtP <= 3.5x a forward "
          f"({atp_s / forward_s:.2f}x); AtP top-20 heads >= 15/20 ({round(agreement['top_k_overlap'] * 20)}/20)")


if __name__ == "__main__":
    main()
