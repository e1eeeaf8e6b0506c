"""Encoder-decoder generation: resid's EncoderDecoder.generate vs transformers' generate with its cache, same
random weights, same sources, greedy, one process.

    python benchmarks/bench_seq2seq_generate.py [--repeats 3] [--new 32] [--source 32]

Models: the tests' tiny random Marian and T5 v1.1, and a T5-small-sized T5 v1.1 (d_model 512, 6 + 6 layers,
8 heads of 64, d_ff 2048, vocab 32,128); batch 1 and 8. transformers runs `generate(do_sample=False,
num_beams=1, max_new_tokens=N)` with nothing forced (min_length 0, no eos), so both make exactly N tokens;
the tokens are compared. Prints tokens/s (new tokens x batch / wall time, median of interleaved rounds) and the
ratio the T5 issue targets (resid >= 1.0x transformers).
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
from seq2seq_models import marian  # noqa: E402  -- the tests' tiny random models, saved as folders
from t5_models import t5  # noqa: E402

T5_SMALL = dict(std=0.02, vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_decoder_layers=6,
                num_heads=8, relative_attention_num_buckets=32, relative_attention_max_distance=128)
MODELS = {
    "tiny Marian": lambda folder: marian(folder),
    "tiny T5 v1.1": lambda folder: t5(folder, "1.1", num_decoder_layers=2),
    "T5-small-sized v1.1": lambda folder: t5(folder, "1.1", **T5_SMALL),
}


def measure(name: str, batch: int, n_source: int, new: int, repeats: int) -> tuple[float, float, bool]:
    with tempfile.TemporaryDirectory() as folder:
        hf = MODELS[name](Path(folder))
        model = resid.load(folder)
    hf.set_attn_implementation("sdpa")
    vocab = hf.config.vocab_size
    source = torch.randint(2, min(vocab, 50), (batch, n_source), generator=torch.Generator().manual_seed(0))
    options = dict(do_sample=False, num_beams=1, max_new_tokens=new, min_length=0, forced_eos_token_id=None,
                   bad_words_ids=None, eos_token_id=None)
    theirs = hf.generate(input_ids=source, **options)[:, 1:]
    ours = model.generate(source, new).new_ids
    times = interleaved({
        "resid": lambda: model.generate(source, new),
        "transformers": lambda: hf.generate(input_ids=source, **options),
    }, repeats)
    return batch * new / times["resid"], batch * new / times["transformers"], torch.equal(ours, theirs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--source", type=int, default=32)
    args = parser.parse_args()
    transformers.utils.logging.set_verbosity_error()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads, "
          f"greedy, {args.new} new tokens from {args.source}-token sources, median of {args.repeats} rounds")
    print("model | batch | resid tokens/s | transformers tokens/s | resid / transformers | same tokens")
    for name in MODELS:
        for batch in (1, 8):
            ours, theirs, same = measure(name, batch, args.source, args.new, args.repeats)
            print(f"{name} | {batch} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.2f}x | {same}", flush=True)


if __name__ == "__main__":
    main()
