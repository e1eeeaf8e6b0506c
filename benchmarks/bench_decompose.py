"""Per-head direct attribution benchmark: resid vs a plain transformers forward vs TransformerLens's documented
path, one process, same weights, same inputs.

    python benchmarks/bench_decompose.py [--prompts 8] [--tokens 64] [--repeats 7] [--tl compat|none]

SmolLM2-135M, `--prompts` prompts of exactly `--tokens` tokens each, per-head attribution of the logit difference
between the model's top two predictions at the last position (a difference, because TL's compatibility mode
centres the unembedding, which shifts every single logit but no difference). Cases:
  hf_forward   transformers LlamaForCausalLM (fp32, use_cache=False) forward on the same ids, the faster of its eager
               and SDPA attention (both timed, as hf_eager and hf_sdpa): the floor of any tool that runs the model
               and reads its logits
  resid        resid.analyses.attribution.direct(model, prompts, level="head") end to end: tokenization, the forward
               (capturing only z and the writes at the last position, unembedding only there), the projection
               and the DataFrame
  tl           TransformerLens 4.3 (TransformerBridge in compatibility mode, i.e. HookedTransformer numerics):
               run_with_cache(names_filter=the hooks it reads: attn.hook_z, ln_final.hook_scale, as a TL user
               would pass it) -> cache.stack_head_results(layer=-1, pos_slice=-1) -> cache.apply_ln_to_stack ->
               dot with W_U[:, target], as TL's docs do it
Prints median wall time over interleaved rounds, ratios against hf_forward and tl, the targets (resid <= 0.9x
the HF forward, >= 2x faster than TL, <= 0.5x TL's peak memory), the agreement of the per-head values, and
the peak extra resident memory of each case over the memory held before it.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: nothing may try the network

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from bench_ablation import REFERENCE, load_tl, reset_peak_rss, rss_mb

import resid
from resid.analyses import attribution
from resid.load.registry import smollm2_path

WORDS = (
    "The history of the city began long before the bridge was built across the river and the first market "
    "opened near the old gate where traders from the north sold wool salt and iron to farmers who walked "
    "for days to reach the square while the bells of the cathedral rang each hour and children ran between "
    "the stalls laughing at the jugglers and the musicians who played songs about the sea the mountains and "
    "the long winter that every family remembered"
).split()


def make_prompts(model: resid.Transformer, n: int, n_tokens: int) -> list[str]:
    """n distinct prompts of exactly n_tokens tokens (BOS included if the tokenizer adds one)."""
    prompts = []
    for start in range(len(WORDS)):
        words = WORDS[start:] + WORDS[:start]
        text = ""
        for word in words:
            text = f"{text} {word}".strip()
            length = len(model.to_str_tokens(text))
            if length >= n_tokens:
                break
        if length == n_tokens and text not in prompts:
            prompts.append(text)
        if len(prompts) == n:
            return prompts
    raise SystemExit(f"could only build {len(prompts)} prompts of {n_tokens} tokens")


def timed(fn: Callable[[], object]) -> tuple[float, object, float]:
    reset_peak_rss()
    before = rss_mb("VmRSS")
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    return elapsed, result, rss_mb("VmHWM") - before


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--tl", choices=["compat", "none"], default="compat")
    args = parser.parse_args()
    torch.set_grad_enabled(False)

    model = resid.load("smollm2-135m")
    prompts = make_prompts(model, args.prompts, args.tokens)
    ids = model.to_tokens(prompts).ids
    from transformers import AutoModelForCausalLM

    path = smollm2_path()
    hf = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    mask = torch.ones_like(ids)
    bridges = load_tl("compat") if args.tl == "compat" else {}
    bridge = bridges.get("tl_compat")
    if bridge is not None:
        del hf.model  # the bridge holds its own copy; keep the process's memory comparable
        hf = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
        ).eval()
    print(f"SmolLM2-135M, {len(prompts)} prompts x {ids.shape[1]} tokens, per-head attribution at the last position, "
          f"{torch.get_num_threads()} threads, reference config {REFERENCE}")

    def hf_forward(mode: str) -> Callable[[], torch.Tensor]:
        def forward():
            hf.set_attn_implementation(mode)
            return hf(input_ids=ids, attention_mask=mask, use_cache=False).logits
        return forward

    top2 = model.run(ids, capture=resid.Capture.none(), logits_at="last").logits[:, 0].topk(2).indices
    targets, baselines = top2[:, 0], top2[:, 1]

    def resid_case():
        return attribution.direct(model, prompts, targets.tolist(), baselines.tolist(), level="head")

    def tl_case():
        logits, cache = bridge.run_with_cache(ids, names_filter=lambda name: name.endswith("attn.hook_z") or
                                              name == "ln_final.hook_scale")
        stack, labels = cache.stack_head_results(layer=-1, pos_slice=-1, return_labels=True)
        stack = cache.apply_ln_to_stack(stack, layer=-1, pos_slice=-1)  # [head_label batch d_model]
        directions = (bridge.W_U[:, targets] - bridge.W_U[:, baselines]).T  # [batch d_model]
        return (stack * directions).sum(-1), labels

    cases = {"hf_eager": hf_forward("eager"), "hf_sdpa": hf_forward("sdpa"), "resid": resid_case}
    if bridge is not None:
        cases["tl"] = tl_case
    times = {name: [] for name in cases}
    peaks = {name: [] for name in cases}
    results = {}
    for name, fn in cases.items():  # warm-up round, not timed
        results[name] = fn()
    for _ in range(args.repeats):
        for name, fn in cases.items():
            elapsed, results[name], peak = timed(fn)
            times[name].append(elapsed)
            peaks[name].append(peak)

    median = {name: statistics.median(t) for name, t in times.items()}
    peak = {name: max(p) for name, p in peaks.items()}
    faster = min(("hf_eager", "hf_sdpa"), key=median.get)  # the baseline: transformers' faster mode
    median["hf_forward"], peak["hf_forward"] = median[faster], peak[faster]
    print(f"\n{'case':<12} {'median s':>9} {'vs hf_forward':>14} {'peak extra MB':>14}")
    for name in cases:
        print(f"{name:<12} {median[name]:9.3f} {median[name] / median['hf_forward']:13.2f}x {peak[name]:14.0f}")

    df = results["resid"]
    sums = df.groupby("prompt_idx").agg(total=("value", "sum"), logit=("logit", "first"))
    print(f"\nresid completeness: max |sum of components - logit| = {(sums.total - sums.logit).abs().max():.2e}")
    print(f"target resid <= 0.9x hf_forward: {median['resid'] / median['hf_forward']:.2f}x")
    if bridge is not None:
        tl_values, labels = results["tl"]
        heads = df[df["head"].notna()]
        ours = torch.tensor(heads["value"].values, dtype=torch.float32).view(len(prompts), -1)  # [batch layer*head]
        theirs = tl_values.T  # TL's labels run L0H0, L0H1, ...: the same order as resid's head rows
        assert labels[:2] == ["L0H0", "L0H1"]
        print(f"per-head values, resid vs TL: max |difference| = {(ours - theirs).abs().max():.2e}")
        print(f"target resid >= 2x faster than TL: {median['tl'] / median['resid']:.2f}x faster")
        print(f"target resid <= 0.5x TL peak memory: {peak['resid'] / max(peak['tl'], 1e-9):.2f}x "
              f"({peak['resid']:.0f} vs {peak['tl']:.0f} MB)")


if __name__ == "__main__":
    main()
