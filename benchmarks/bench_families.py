"""The forward pass of each model_type added by issue 58 against transformers, at one shape, one process.

    python benchmarks/bench_families.py [--families cohere,granite,...] [--batch 4] [--pos 64] [--repeats 5]
                                        [--width 1]

Each family is its tiny random model of the tests (tests/tiny_models.py: 2 layers, d_model 32-64, the GPT-2
vocabulary) with every width multiplied by --width (1: as tested), saved to a temporary folder and loaded by both.
Per family it prints the largest logit difference to transformers (fp32, eager attention; it must stay under
1e-4) and the median wall time of three cases, interleaved so that drift on a shared machine hits all alike:
  hf        transformers' forward (eager attention, no hidden states)
  none      resid's run with Capture.none() (logits only)
  all       resid's run with Capture.all() (every site of every layer recorded)
The default run (every family, 4 x 64 tokens, 5 rounds) takes about a minute on two cores.
"""

import argparse
import sys
import tempfile
from pathlib import Path

import torch

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tiny_models  # noqa: E402  (the tests' tiny configs: one table of families)
from timing import interleaved  # noqa: E402

import resid  # noqa: E402

WIDTHS = ("hidden_size", "intermediate_size", "moe_intermediate_size", "n_embd", "n_inner", "ffn_dim", "head_dim")


def widened(variant: str, width: int):
    """The tiny config of `variant` with its widths (and head width) times `width`."""
    config = tiny_models.hf_config(variant)
    for name in WIDTHS:
        value = getattr(config, name, None)
        if isinstance(value, int) and width != 1:
            setattr(config, name, value * width)
    return config


def bench(variant: str, batch: int, n_pos: int, repeats: int, width: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        hf = tiny_models.build(variant, Path(folder), widened(variant, width))
        model = resid.load(folder)
        ids = torch.randint(0, tiny_models.D_VOCAB, (batch, n_pos), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            diff = (hf(ids).logits - model.run(ids, capture=resid.Capture.none()).logits).abs().max().item()
        times = interleaved({
            "hf": lambda: hf(ids),
            "none": lambda: model.run(ids, capture=resid.Capture.none()),
            "all": lambda: model.run(ids, capture=resid.Capture.all()),
        }, repeats)
    return {"diff": diff, **times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default=",".join(tiny_models.FAMILIES),
                        help="comma-separated tiny variants (default: every family of issue 58)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--pos", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--width", type=int, default=1, help="multiply every width of the tiny configs by this")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"{args.batch} x {args.pos} tokens, width x{args.width}, {torch.get_num_threads()} threads; median ms "
          "of interleaved rounds")
    print(f"{'model_type':14s} {'max |dlogit|':>12s} {'hf':>8s} {'none':>8s} {'all':>8s} {'none/hf':>8s}")
    worst = 0.0
    for variant in args.families.split(","):
        r = bench(variant, args.batch, args.pos, args.repeats, args.width)
        worst = max(worst, r["diff"])
        print(f"{variant:14s} {r['diff']:12.1e} {r['hf'] * 1e3:8.2f} {r['none'] * 1e3:8.2f} {r['all'] * 1e3:8.2f} "
              f"{r['none'] / r['hf']:8.2f}")
    print(f"largest logit difference {worst:.1e} ({'within' if worst < 1e-4 else 'OVER'} 1e-4)")


if __name__ == "__main__":
    main()
