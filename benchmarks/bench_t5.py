"""T5 forward: resid vs transformers' T5ForConditionalGeneration, same random weights, same inputs, one process.

    python benchmarks/bench_t5.py [--repeats 5] [--threads N]

Two configs per T5 version (v1.0: ReLU, tied and rescaled head; v1.1: gated GELU, own head): a tiny one (the
test suite's shape) and a T5-small-sized one (d_model 512, 6 + 6 layers, 8 heads of 64, d_ff 2048, vocab
32,128), random weights saved to a temporary folder and loaded by resid.load. Timed, interleaved: resid's
forward recording nothing (`model(source, target)`), resid's run with every field of both streams captured,
and transformers' forward with its default (SDPA) and with eager attention, both without the decoder's KV
cache (`use_cache=False`: resid keeps none). Prints median times and the ratio
the T5 issue targets (resid forward <= 1.05x transformers), against the faster of transformers' two.
"""

import argparse
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from timing import interleaved

import resid

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from t5_models import t5  # noqa: E402  -- the tests' tiny random T5 builder, which saves a folder

SIZES = {
    "tiny": dict(batch=8, source=64, target=32, overrides=dict(std=0.3)),
    "t5-small": dict(batch=8, source=128, target=64, overrides=dict(
        std=0.02, vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8,
        relative_attention_num_buckets=32, relative_attention_max_distance=128)),
}


def measure(size: str, version: str, repeats: int) -> dict[str, float]:
    spec = SIZES[size]
    with tempfile.TemporaryDirectory() as folder:
        hf = t5(Path(folder), version, **spec["overrides"])
        model = resid.load(folder)
    vocab = hf.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    source = torch.randint(2, vocab, (spec["batch"], spec["source"]), generator=generator)
    target = torch.randint(2, vocab, (spec["batch"], spec["target"]), generator=generator)
    sdpa = transformers.T5ForConditionalGeneration(hf.config)
    sdpa.load_state_dict(hf.state_dict())
    sdpa.set_attn_implementation("sdpa")
    sdpa.eval()
    with torch.no_grad():
        error = (model(source, target) - hf(input_ids=source, decoder_input_ids=target).logits).abs().max().item()
    everything = resid.Capture.all()
    times = interleaved({
        "resid forward": lambda: model(source, target),
        "resid capture all": lambda: model.run(source, target, capture=everything, encoder_capture=everything),
        "transformers sdpa": lambda: sdpa(input_ids=source, decoder_input_ids=target, use_cache=False),
        "transformers eager": lambda: hf(input_ids=source, decoder_input_ids=target, use_cache=False),
    }, repeats)
    return {**times, "max |logit diff|": error}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads, "
          f"median of {args.repeats} interleaved rounds, fp32 CPU")
    header = ("config", "batch x src x tgt", "resid fwd", "resid all", "HF sdpa", "HF eager", "fwd / best HF",
              "all / best HF", "max |dlogit|")
    print(" | ".join(header))
    for size in SIZES:
        for version in ("1.0", "1.1"):
            t = measure(size, version, args.repeats)
            best = min(t["transformers sdpa"], t["transformers eager"])
            spec = SIZES[size]
            print(" | ".join([
                f"{size} v{version}", f"{spec['batch']}x{spec['source']}x{spec['target']}",
                *(f"{t[k] * 1e3:.1f} ms" for k in ("resid forward", "resid capture all", "transformers sdpa",
                                                  "transformers eager")),
                f"{t['resid forward'] / best:.3f}x", f"{t['resid capture all'] / best:.3f}x",
                f"{t['max |logit diff|']:.1e}",
            ]), flush=True)


if __name__ == "__main__":
    main()
