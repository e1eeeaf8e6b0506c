"""Ablation-sweep benchmark: resid's sweep engine vs a naive resid loop vs TransformerLens, one process, same
weights, same inputs.

    python benchmarks/bench_ablation.py [--prompts 32] [--repeats 1] [--tl both|bridge|compat|none]

The sweep zero-ablates each layer's attention write and each layer's MLP write of SmolLM2-135M, one site at a
time (2 x 30 sites), on IOI-style prompts of one token length (no padding), and measures the logit difference
target - baseline (" Mary" - " John") at the last token. Every case computes the same 60 x prompts deltas:
  resid_sweep     resid.analyses.ablation.sweep(..., sites="sublayer", method="zero", metric="logit_diff")
  resid_loop      one model.run(..., interventions=[ZeroAblate(Site(layer, part))]) per site
  tl_bridge       TransformerLens 4.3 (HookedTransformer was removed in 4.0): TransformerBridge.boot_transformers
                  around the transformers LlamaForCausalLM, TL's default raw weights, run_with_hooks per site
  tl_compat       the same after enable_compatibility_mode() (HookedTransformer numerics: fold_ln, centering)
TL normally fetches config, weights and tokenizer from the Hub; here it is handed a transformers model built
from the GGUF resid loads (as bench_core.py does) and the reference tokenizer, with HF_HUB_OFFLINE=1.
Prints the agreement of every case with resid_loop, median wall time per full sweep (rounds interleaved so drift
hits every case alike), speed-ups, the target (resid_sweep >= 3x faster than TL's loop) and peak RSS.
Bound: an exact zero-ablation must rerun every layer after the ablated one at every position, so resuming
from the clean prefix and unembedding only the last token cut SmolLM2's multiply-adds to 1/2.3 of the loop's.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: nothing may try the network

import argparse
import copy
import ctypes
import random
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

import resid
from resid.load.registry import smollm2_path

# config.json + tokenizer of SmolLM2-135M, committed with the tests so that no Hub download is needed
REFERENCE = Path(__file__).resolve().parents[1] / "tests" / "data" / "smollm2-135m"
TL_NAME = "HuggingFaceTB/SmolLM2-135M"  # only names the adapter; hf_model= keeps TL off the Hub
TEMPLATES = [  # each 14 tokens with single-token names, places and objects; the answer is the non-repeated name
    "When {a} and {b} went to the {place}, {b} gave a {obj} to",
    "While {a} and {b} were at the {place}, {b} handed a {obj} to",
    "After {a} and {b} arrived at the {place}, {b} passed a {obj} to",
    "Later {a} and {b} sat in the {place}, {b} threw a {obj} to",
]
NAMES = ["Mary", "John", "Tom", "James", "Anna", "Paul", "Sarah", "David", "Emma", "Mark", "Lisa", "Peter"]
PLACES = ["store", "park", "office", "school", "beach", "market", "station", "library"]
OBJECTS = ["drink", "ball", "book", "letter", "gift", "key", "pen", "ring"]
PARTS = ("attn", "mlp")

Deltas = Tensor  # [layer part prompt]: ablated - clean logit difference; index 0/1 of part = attn/mlp


def make_prompts(model: resid.Transformer, n: int) -> tuple[list[str], list[str], list[str]]:
    """n distinct prompts of one token length (so no padding anywhere), their targets and baselines."""
    rng = random.Random(0)
    width = len(model.to_tokens(TEMPLATES[0].format(a="Mary", b="John", place="store", obj="drink")).ids[0])
    prompts, targets, baselines = [], [], []
    for _ in range(100 * n):
        if len(prompts) == n:
            break
        a, b = rng.sample(NAMES, 2)
        text = TEMPLATES[len(prompts) % len(TEMPLATES)].format(
            a=a, b=b, place=rng.choice(PLACES), obj=rng.choice(OBJECTS)
        )
        if text not in prompts and len(model.to_tokens(text).ids[0]) == width:
            prompts.append(text)
            targets.append(" " + a)
            baselines.append(" " + b)
    assert len(prompts) == n, f"found only {len(prompts)} prompts of {width} tokens"
    for word in {*targets, *baselines}:
        model.to_single_token(word)  # raises, naming the word, where it is not one token (BOS not counted)
    return prompts, targets, baselines


def logit_diff(last_logits: Tensor, target_ids: Tensor, baseline_ids: Tensor) -> Tensor:
    rows = torch.arange(last_logits.shape[0])
    return last_logits[rows, target_ids] - last_logits[rows, baseline_ids]


def resid_sweep(model, prompts, targets, baselines) -> Callable[[], Deltas]:
    from resid.analyses import Execution, ablation

    n_layers = model.config.n_layers

    def fn() -> Deltas:
        df = ablation.sweep(model, prompts, targets, baselines, sites="sublayer", method="zero",
                            metric="logit_diff", execution=Execution(progress=False))
        assert len(df) == 2 * n_layers * len(prompts), f"expected {2 * n_layers * len(prompts)} rows, got {len(df)}"
        deltas = torch.full((n_layers, 2, len(prompts)), float("nan"))
        for layer, part, prompt, delta in zip(df["layer"], df["part"], df["prompt_idx"], df["delta"]):
            deltas[int(layer), PARTS.index(part), int(prompt)] = float(delta)
        assert not deltas.isnan().any(), "the sweep's DataFrame misses some (layer, part, prompt)"
        return deltas

    return fn


def resid_loop(model, ids, target_ids, baseline_ids) -> Callable[[], Deltas]:
    def metric(interventions) -> Tensor:
        logits = model.run(ids, capture=resid.Capture.none(), interventions=interventions).logits
        return logit_diff(logits[:, -1], target_ids, baseline_ids)

    def fn() -> Deltas:
        clean = metric([])
        return torch.stack(
            [
                torch.stack([metric([resid.ZeroAblate(resid.Site(layer, part))]) - clean for part in PARTS])
                for layer in range(model.config.n_layers)
            ]
        )

    return fn


def zero_hook(value: Tensor, hook) -> Tensor:
    return torch.zeros_like(value)


def tl_loop(bridge, ids, target_ids, baseline_ids, n_layers) -> Callable[[], Deltas]:
    def metric(fwd_hooks) -> Tensor:
        logits = bridge.run_with_hooks(ids, fwd_hooks=fwd_hooks)
        return logit_diff(logits[:, -1], target_ids, baseline_ids)

    def fn() -> Deltas:
        clean = metric([])
        return torch.stack(
            [
                torch.stack([metric([(f"blocks.{layer}.hook_{part}_out", zero_hook)]) - clean for part in PARTS])
                for layer in range(n_layers)
            ]
        )

    return fn


def load_tl(which: str) -> dict:
    """TransformerBridges around a transformers LlamaForCausalLM holding the GGUF's weights; {} without TL."""
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError as error:
        print(
            f"note: TransformerLens not importable ({error}); skipping the TL cases "
            "(pip install transformer-lens==4.3.0)"
        )
        return {}
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smollm2_path()
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(REFERENCE)
    bridges = {}
    if which in ("both", "bridge"):
        # hf_model= makes boot reuse the model's own config; tokenizer= skips AutoTokenizer(TL_NAME)
        bridges["tl_bridge"] = TransformerBridge.boot_transformers(
            TL_NAME, hf_model=copy.deepcopy(hf) if which == "both" else hf, tokenizer=tokenizer, device="cpu"
        )
    if which in ("both", "compat"):
        bridge = TransformerBridge.boot_transformers(TL_NAME, hf_model=hf, tokenizer=tokenizer, device="cpu")
        bridge.enable_compatibility_mode(disable_warnings=True)  # rewrites hf's weights in place: hence the copy
        bridges["tl_compat"] = bridge
    return bridges


def rss_mb(field: str = "VmHWM") -> float:
    """Resident (VmRSS) or peak resident (VmHWM) memory of this process; peak from getrusage off Linux."""
    try:
        with open("/proc/self/status") as f:
            status = dict(line.split(":", 1) for line in f)
        return int(status[field].split()[0]) / 1024
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux, bytes on macOS


def reset_peak_rss() -> None:
    """Linux: hand freed heap back to the OS (else the GGUF dequantisation's arenas hide every later peak),
    then write 5 to clear_refs, which resets VmHWM, so each case's peak is its own."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except (OSError, AttributeError):
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1, help="full sweeps per case, interleaved")
    parser.add_argument("--tl", choices=["both", "bridge", "compat", "none"], default="both")
    args = parser.parse_args()
    torch.set_grad_enabled(False)  # resid's run is no-grad by default; TL's run_with_hooks is not

    model = resid.load("smollm2-135m")
    prompts, targets, baselines = make_prompts(model, args.prompts)
    tokens = model.to_tokens(prompts)
    assert bool(tokens.attention_mask.all()), "prompts must not need padding"
    ids = tokens.ids
    target_ids = torch.tensor([model.to_tokens(t).ids[0, 0] for t in targets])
    baseline_ids = torch.tensor([model.to_tokens(b).ids[0, 0] for b in baselines])
    n_layers = model.config.n_layers
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}; "
        f"{len(prompts)} prompts x {ids.shape[1]} tokens, {2 * n_layers} sites (attn, mlp x {n_layers} layers), "
        f"e.g. {prompts[0]!r} -> {targets[0]!r} vs {baselines[0]!r}"
    )

    clean = logit_diff(model.run(ids, capture=resid.Capture.none()).logits[:, -1], target_ids, baseline_ids)
    cases: dict[str, Callable[[], Deltas]] = {}
    try:
        resid_sweep(model, prompts[:2], targets[:2], baselines[:2])()  # warm-up, and fail early if it is broken
        cases["resid_sweep"] = resid_sweep(model, prompts, targets, baselines)
    except ImportError as error:  # a checkout without the engine still runs the loops
        print(f"note: skipping resid_sweep: {error}")
    cases["resid_loop"] = resid_loop(model, ids, target_ids, baseline_ids)
    loaded = {"resid": rss_mb()}
    bridges = load_tl(args.tl) if args.tl != "none" else {}
    if bridges:
        for name, bridge in bridges.items():
            tl_clean = logit_diff(bridge(ids)[:, -1], target_ids, baseline_ids)
            gap = (tl_clean - clean).abs().max().item()
            print(f"{name}: max |clean logit diff - resid| = {gap:.2e}")
            assert gap < 1e-3, f"{name} does not reproduce resid's clean logit difference ({gap:.2e})"
            cases[name] = tl_loop(bridge, ids, target_ids, baseline_ids, n_layers)
        loaded["resid + TL"] = rss_mb()

    times: dict[str, list[float]] = {name: [] for name in cases}
    deltas: dict[str, Deltas] = {}
    extra: dict[str, float] = {name: 0.0 for name in cases}  # peak RSS during a sweep above the RSS before it
    for _ in range(args.repeats):  # interleaved; each case's first forward already ran above (warm)
        for name, fn in cases.items():
            reset_peak_rss()
            resident = rss_mb("VmRSS")
            start = time.perf_counter()
            deltas[name] = fn()
            times[name].append(time.perf_counter() - start)
            extra[name] = max(extra[name], rss_mb() - resident)

    reference = deltas["resid_loop"]
    for name in cases:
        if name != "resid_loop":
            print(f"max |delta {name} - delta resid_loop| = {(deltas[name] - reference).abs().max().item():.2e}")
    print(
        f"clean logit diff: mean {clean.mean().item():.3f}, {int((clean > 0).sum())}/{len(prompts)} > 0; "
        f"largest mean |delta|: "
        + ", ".join(f"{PARTS[i % 2]} L{i // 2} {v:.2f}" for v, i in zip(*reference.abs().mean(-1).flatten().topk(3)))
    )
    median = {name: statistics.median(t) for name, t in times.items()}
    base_name = "resid_sweep" if "resid_sweep" in median else "resid_loop"
    base = median[base_name]
    print(
        f"\n{'case':<14} {'sweep s':>9} {'per site ms':>12} {'x ' + base_name:>14}   ({args.repeats} round(s), median)"
    )
    for name, value in median.items():
        print(f"{name:<14} {value:9.2f} {value / (2 * n_layers) * 1000:12.1f} {value / base:14.2f}")
    if "resid_sweep" in median:
        for name in ("resid_loop", "tl_bridge", "tl_compat"):
            if name in median:
                print(f"resid_sweep is {median[name] / median['resid_sweep']:.1f}x faster than {name}")
        tl = [median[name] for name in ("tl_bridge", "tl_compat") if name in median]
        if tl:
            ok = min(tl) / median["resid_sweep"] >= 3
            print(f"target: resid_sweep >= 3x faster than TL's loop [{'ok' if ok else 'MISSED'}]")
    print(
        "peak RSS after loading "
        + ", ".join(f"{k} {v:.0f} MB" for k, v in loaded.items())
        + "; extra peak during a sweep: "
        + ", ".join(f"{k} +{v:.0f} MB" for k, v in extra.items())
    )
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
