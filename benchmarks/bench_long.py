"""Long prompts: resid vs transformers' SDPA attention on SmolLM2-135M, batch 1, across lengths, one process.

    python benchmarks/bench_long.py [--lengths 128,512,1024,2048,4096] [--repeats 3]

Prints median wall times of a plain forward (no capture) and of the default capture (the residual writes), as
ratios to transformers with attn_implementation="sdpa" on the same weights, without its KV cache
(`use_cache=False`: resid keeps none, and building the cache is work a plain forward does not need). An
unpadded prompt lets resid hand SDPA `is_causal` instead of an explicit mask, so its causal kernels apply;
padding and sliding windows keep the explicit mask (exact either way). Target (issue 14): <= 1.05x
transformers' SDPA at every length.
"""

import argparse
import statistics
import time

import torch

import resid
from resid.load.registry import smollm2_path


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    from transformers import AutoModelForCausalLM

    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", default="128,512,1024,2048,4096")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    path = smollm2_path()
    hf = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, attn_implementation="sdpa", dtype=torch.float32
    ).eval()
    model = resid.load("smollm2-135m")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, SmolLM2-135M fp32, batch 1")
    worst = 0.0
    for n in [int(x) for x in args.lengths.split(",")]:
        ids = torch.randint(0, model.config.d_vocab, (1, n), generator=torch.Generator().manual_seed(n))
        cases = {
            "hf_sdpa": lambda: hf(ids, use_cache=False),
            "resid_no_capture": lambda: model.run(ids, capture=resid.Capture.none()),
            "resid_default_capture": lambda: model.run(ids),
        }
        with torch.no_grad():
            ours = model.run(ids, capture=resid.Capture.none()).logits
            diff = (hf(ids, use_cache=False).logits - ours).abs().max().item()
            for fn in cases.values():  # warm-up
                fn()
            times = {name: [] for name in cases}
            for _ in range(args.repeats):  # interleaved, so drift hits every case alike
                for name, fn in cases.items():
                    times[name].append(median_time(fn, 1))
        median = {name: statistics.median(t) for name, t in times.items()}
        ratios = {name: median[name] / median["hf_sdpa"] for name in cases}
        worst = max(worst, ratios["resid_no_capture"])
        print(f"{n:>5} tokens: hf_sdpa {median['hf_sdpa'] * 1000:8.1f} ms "
              f"| no capture {ratios['resid_no_capture']:.3f}x"
              f" | default capture {ratios['resid_default_capture']:.3f}x | max |logit diff| {diff:.1e}")
    print(f"target: no capture <= 1.05x at every length [{'ok' if worst <= 1.05 else 'MISSED'}: worst {worst:.3f}x]")


if __name__ == "__main__":
    main()
