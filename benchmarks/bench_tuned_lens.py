"""Tuned-lens benchmark: training tokens/s of resid vs tuned-lens's own trainer on the same model, data and
hardware, then the per-layer KL of resid's tuned lens vs the logit lens on held-out text.

    python benchmarks/bench_tuned_lens.py [--steps 2] [--tokens-per-step 512] [--seq-len 256] [--batch-size 2]
                                          [--translators DIR] [--eval-tokens 2048] [--tuned-lens none]

Training (SmolLM2-135M, float32 weights, the demo corpus's training paragraphs, windows of --seq-len tokens packed
with end-of-text separators, --batch-size windows per forward pass, --tokens-per-step per optimizer step):
  tuned_lens  `python -m tuned_lens train` (tuned-lens 0.2.0, its own loop: a translator's forward and KL under
              bfloat16 autocast, autograd through log_softmax, SGD Nesterov) in its own environment
              (tests/data/make_tuned_lens_reference.py builds it; the model is SmolLM2's GGUF dequantized by
              transformers 4.46 there and saved as a folder, checked to give resid's logits)
  resid       resid.analyses.lenses.training.train with the same recipe (bfloat16 readout, one-pass KL gradient)
Each trainer runs 1 step and 1 + --steps steps; the difference of the two wall times is --steps steps without any
set-up (model loading, tokenization), so tokens/s = steps * tokens-per-step / difference. Target: resid >= 2x.

KL per layer: the logit lens and resid's tuned lens (--translators, e.g. from `resid lens train`; default: the lens
trained above, a few steps only) on --eval-tokens held-out tokens (resid.analyses.lenses.evaluation). Target: the
tuned lens lower at every layer but the last (where both are the model).
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: nothing may try the network

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

import resid
from resid.analyses import tuned_lens
from resid.analyses.distributed.execution import Execution
from resid.analyses.io import corpus
from resid.load.registry import smollm2_path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "bench_tuned_lens"
REFERENCE = ROOT / "tests" / "data" / "smollm2-135m"  # tokenizer.json + tokenizer_config.json of SmolLM2
GGUF_PIN = "gguf==0.19.0"  # transformers 4.46 reads SmolLM2's GGUF through it (the conversion below)
CONVERT = """
import json, sys, torch, transformers
gguf, out, ids = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
folder, name = gguf.rsplit("/", 1)
# transformers 4.46 does not read tied embeddings from a GGUF without output.weight: SmolLM2 ties them
model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32,
                                                          tie_word_embeddings=True).eval()
model.save_pretrained(out)
with torch.no_grad():
    print(json.dumps(model(torch.tensor([ids])).logits[0, -1].tolist()))
"""


def tuned_lens_python(venv: Path) -> Path:
    spec = importlib.util.spec_from_file_location("make_ref", ROOT / "tests" / "data" / "make_tuned_lens_reference.py")
    make_ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_ref)
    python = make_ref.build_venv(venv)
    if subprocess.run([str(python), "-c", "import gguf"], capture_output=True).returncode:
        subprocess.run([str(python), "-m", "pip", "-q", "install", GGUF_PIN, make_ref.TORCH, "transformers==4.46.3"],
                       check=True)
    return python


def hf_folder(python: Path, model: resid.Transformer) -> Path:
    """SmolLM2 as a transformers folder tuned-lens can load, checked against resid's logits."""
    folder = WORK / "smollm2-hf"
    ids = model.to_tokens("The Eiffel Tower is located in the city of").ids[0].tolist()
    done = subprocess.run([str(python), "-c", CONVERT, str(smollm2_path()), str(folder), json.dumps(ids)],
                          check=True, capture_output=True, text=True)
    theirs = torch.tensor(json.loads(done.stdout.strip().splitlines()[-1]))
    ours = model.run(torch.tensor([ids])).logits[0, -1]
    print(f"tuned-lens's copy of SmolLM2 vs resid's: max |logit difference| {(theirs - ours).abs().max():.2e}")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(REFERENCE / name, folder / name)
    return folder


def time_tuned_lens(python: Path, folder: Path, data: Path, args, steps: int) -> float:
    out = WORK / f"tuned_lens_out_{steps}"
    shutil.rmtree(out, ignore_errors=True)
    command = [str(python), "-m", "tuned_lens", "train", "--model.name", str(folder), "--data.name", str(data),
               "--max_length", str(args.seq_len), "--tokens_per_step", str(args.tokens_per_step), "--num_steps",
               str(steps), "--per_gpu_batch_size", str(args.batch_size), "--precision", "float32", "-o", str(out)]
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env={**os.environ, "WANDB_MODE": "disabled"})
    return time.perf_counter() - start


def time_resid(model, training, args, steps: int) -> tuple[float, tuned_lens.TunedLens]:
    recipe = tuned_lens.Recipe(steps=steps, tokens_per_step=args.tokens_per_step, seq_len=args.seq_len)
    start = time.perf_counter()
    lens = tuned_lens.train(model, training, recipe, Execution(batch_size=args.batch_size, progress=False))
    return time.perf_counter() - start, lens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2, help="steps timed (after a 1-step run for the set-up)")
    parser.add_argument("--tokens-per-step", type=int, default=512)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=2, help="windows per forward pass, both trainers")
    parser.add_argument("--translators", default=None, help="a tuned lens to evaluate (default: the one trained here)")
    parser.add_argument("--eval-tokens", type=int, default=2048)
    parser.add_argument("--tuned-lens", choices=["venv", "none"], default="venv")
    parser.add_argument("--venv", type=Path, default=ROOT / "build" / "tuned-lens-venv")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)

    model = resid.load("smollm2-135m")
    training, held_out = tuned_lens.split(corpus.demo())
    data = WORK / "train.jsonl"
    data.write_text("".join(json.dumps({"text": text}) + "\n" for text in training), encoding="utf-8")
    print(f"SmolLM2-135M, {len(training)} training / {len(held_out)} held-out paragraphs, windows of {args.seq_len}, "
          f"{args.tokens_per_step} tokens per step, {args.batch_size} windows per forward, "
          f"{torch.get_num_threads()} threads")
    trained = {}

    def resid_run(steps: int) -> float:
        seconds, trained["lens"] = time_resid(model, training, args, steps)  # the last: the lens evaluated below
        return seconds

    trainers = {"resid": resid_run}
    if args.tuned_lens == "venv":
        try:
            python = tuned_lens_python(args.venv)
            folder = hf_folder(python, model)
            trainers["tuned_lens"] = lambda steps: time_tuned_lens(python, folder, data, args, steps)
        except (OSError, subprocess.CalledProcessError) as error:
            detail = getattr(error, "stderr", b"") or b""
            print(f"tuned-lens could not be set up here: {error}\n{detail.decode(errors='replace')[-2000:]}")
    seconds = {name: {} for name in trainers}
    for steps in (1, 1 + args.steps):  # interleaved, so that drift on a shared machine hits both alike
        for name, run in trainers.items():
            seconds[name][steps] = run(steps)
    rates = {name: args.steps * args.tokens_per_step / (s[1 + args.steps] - s[1]) for name, s in seconds.items()}
    print(f"\n{'trainer':<12} {'1 step s':>9} {f'{1 + args.steps} steps s':>10} {'tokens/s':>9}")
    for name, rate in rates.items():
        print(f"{name:<12} {seconds[name][1]:9.1f} {seconds[name][1 + args.steps]:10.1f} {rate:9.1f}")
    if "tuned_lens" in rates:
        print(f"target resid >= 2x tuned-lens's trainer: {rates['resid'] / rates['tuned_lens']:.2f}x")

    lens = tuned_lens.read(model, args.translators) if args.translators is not None else trained["lens"]
    df = tuned_lens.evaluate(model, held_out, [lens], seq_len=512, max_tokens=args.eval_tokens,
                             execution=Execution(progress=False))
    kl = df.pivot_table(index="label", columns="lens", values="kl", sort=False)
    print(f"\nKL(final || lens) per layer on {df['tokens'].iloc[0]} held-out tokens (nats), tuned lens trained on "
          f"{lens.translators.info.get('tokens', '?')} tokens")
    print(f"{'site':<16} {'logit':>8} {'tuned':>8} {'tuned/logit':>12}")
    for label, row in kl.iterrows():
        print(f"{label:<16} {row['logit']:8.3f} {row['tuned']:8.3f} "
              f"{row['tuned'] / max(row['logit'], 1e-12):12.3f}")
    lower = (kl["tuned"] < kl["logit"]).iloc[:-1]
    print(f"target tuned lens lower at every layer but the last: {int(lower.sum())}/{len(lower)} layers")


if __name__ == "__main__":
    sys.exit(main())
