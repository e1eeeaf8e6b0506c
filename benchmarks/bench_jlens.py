"""J-lens benchmark: fitting time per 1,000 tokens of resid vs TransformerLens 4.3 on the same model, windows and
batch, then on SmolLM2 the KL to the final distribution per layer of the logit, tuned and J-lens.

    python benchmarks/bench_jlens.py [--d-model 128] [--layers 4] [--seq-len 64] [--prompts 4] [--block 8]
                                     [--threads 1] [--rounds 3] [--folder DIR]
                                     [--smollm2-windows 2] [--smollm2-seq-len 32] [--tuned-steps 4]
                                     [--eval-tokens 1024] [--figure jlens.html] [--reference none] [--smollm2 no]

Fitting (a random Llama of --d-model and --layers, float32, built and saved by transformers in TransformerLens's
environment, which tests/data/make_jlens_reference.py builds; its word-level tokenizer; or --folder, a transformers
Llama folder such as the SmolLM2 layers that script saves under build/; --prompts prompts of --seq-len tokens, BOS
first; skip_first 16):
  transformer_lens  JacobianLens.fit(bridge, prompts, dim_batch=--block): one prompt per forward pass, replicated
                    --block times, one backward per --block output dimensions
  resid (same)      fit_jacobian(batch_size=1, block=--block): the same batching
  resid (batched)   fit_jacobian(batch_size=--prompts, block=1): every window in one forward pass, one backward per
                    output dimension for all of them
Each is timed after a warm-up fit of one prompt, with --threads torch threads for both (default 1: on a CPU that
other jobs share, two threads over-subscribe it and every small kernel waits for a descheduled thread, which made
single timings swing 3-10x), in --rounds interleaved rounds (a TransformerLens process, then resid's two fits):
the median and fastest round of each. Both fits are checked to agree (1e-4 relative).

SmolLM2-135M: a J-lens fitted (block --block) on --smollm2-windows training windows of --smollm2-seq-len tokens
(skip_first 4: short windows on a CPU; the reference fits 100-1000 prompts of 128 tokens), a tuned lens trained for
--tuned-steps steps,
both evaluated with the logit lens on --eval-tokens held-out tokens (resid.analyses.lenses.evaluate): the KL table per
layer, and the figure (--figure).
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import resid
from resid.analyses import Execution, lenses
from resid.analyses.io import corpus
from resid.analyses.lenses import plots as lens_plots

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "bench_jlens"
MAKE = ROOT / "tests" / "data" / "make_jlens_reference.py"
SKIP = 16

TL_FIT = """
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[4]))
from transformer_lens.model_bridge import TransformerBridge
from transformer_lens.tools.analysis import JacobianLens
folder, prompts, block, seq_len = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[5])
bridge = TransformerBridge.boot_transformers(folder, device="cpu", dtype=torch.float32)
bridge.eval()
fit = lambda texts, name: JacobianLens.fit(bridge, texts, corpus=name, dim_batch=block, max_seq_len=seq_len,
                                           show_progress=False)
fit(prompts[:1], "warm-up")
start = time.perf_counter()
lens = fit(prompts, "bench")
elapsed = time.perf_counter() - start
ids = torch.cat([bridge.to_tokens(p)[:, :seq_len] for p in prompts])
print(json.dumps({"seconds": elapsed, "ids": ids.tolist(),
                  "J": {str(k): v.tolist() for k, v in lens.jacobians.items()}}))
"""

BUILD = """
import sys, torch, transformers
sys.path.insert(0, sys.argv[4])
from make_jlens_reference import WORDS, tokenizer
d, layers, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
config = transformers.LlamaConfig(vocab_size=len(WORDS) + 3, hidden_size=d, intermediate_size=4 * d,
    num_hidden_layers=layers, num_attention_heads=d // 32, num_key_value_heads=d // 64 or 1,
    max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(config).eval()
model.save_pretrained(folder, safe_serialization=True)
tokenizer(__import__("pathlib").Path(folder))
"""


def reference_python(venv: Path) -> Path:
    spec = importlib.util.spec_from_file_location("make_jlens_reference", MAKE)
    make = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(MAKE.parent))
    spec.loader.exec_module(make)
    from reference_venv import build_venv

    return build_venv(venv, "torch==2.13.0", make.PINS), make.WORDS


def timed_fit(model, ids, batch_size: int, block: int) -> tuple[float, lenses.JacobianLens]:
    sites = [resid.Site(layer, "resid_post") for layer in range(model.config.n_layers - 1)]
    lenses.fit_jacobian(model, ids[:1], sites=sites, skip_first=SKIP, block=block,
                        execution=Execution(batch_size=1, progress=False))  # warm-up
    start = time.perf_counter()
    lens = lenses.fit_jacobian(model, ids, sites=sites, skip_first=SKIP, block=block,
                               execution=Execution(batch_size=batch_size, progress=False))
    return time.perf_counter() - start, lens


def fitting(args) -> None:
    python, words = reference_python(args.venv)
    folder = args.folder or WORK / f"llama-d{args.d_model}-l{args.layers}"
    if not (folder / "model.safetensors").is_file():
        subprocess.run([str(python), "-c", BUILD, str(args.d_model), str(args.layers), str(folder), str(MAKE.parent)],
                       check=True, capture_output=True)
    generator = torch.Generator().manual_seed(0)
    prompts = [" ".join(words[int(i)] for i in torch.randint(0, len(words), (args.seq_len - 1,), generator=generator))
               for _ in range(args.prompts)]
    torch.set_num_threads(args.threads)
    model = resid.load(folder)
    names = (f"TransformerLens 4.3 (dim_batch={args.block}, one prompt per pass)",
             f"resid (batch 1, block {args.block}: the same batching)", f"resid (batch {args.prompts}, block 1)")
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.rounds):  # interleaved: each round times the three fits one after the other
        done = subprocess.run([str(python), "-c", TL_FIT, str(folder), json.dumps(prompts), str(args.block),
                               str(args.threads), str(args.seq_len)], check=True, capture_output=True, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
        theirs = json.loads(done.stdout.strip().splitlines()[-1])
        ids = torch.tensor(theirs["ids"])
        same, lens = timed_fit(model, ids, 1, args.block)
        batched, _ = timed_fit(model, ids, args.prompts, 1)
        for name, seconds in zip(names, (theirs["seconds"], same, batched)):
            times[name].append(seconds)
    worst = max(float((lens.jacobians[i].cpu().double() - torch.tensor(theirs["J"][str(i)]).double()).abs().max()
                      / torch.tensor(theirs["J"][str(i)]).abs().max()) for i in range(len(lens.sites)))
    tokens = ids.numel()
    what = folder.name if args.folder else f"random Llama d_model={args.d_model}, {args.layers} layers"
    print(f"{what}, {args.prompts} prompts x {args.seq_len} tokens ({tokens} tokens), skip_first {SKIP}, "
          f"{args.threads} thread(s), {args.rounds} interleaved rounds; largest relative difference of J: {worst:.1e}")
    print("| fit | s per 1,000 tokens: median | fastest | every round |\n| --- | ---: | ---: | --- |")
    for name, seconds in times.items():
        per = [1000 * t / tokens for t in seconds]
        print(f"| {name} | {statistics.median(per):.2f} | {min(per):.2f} | {', '.join(f'{t:.2f}' for t in per)} |")


def smollm2(args) -> None:
    model = resid.load("smollm2-135m", dtype=torch.float32)
    training, held_out = lenses.split(corpus.demo())
    quiet = Execution(progress=False)
    start = time.perf_counter()
    jlens = lenses.fit_jacobian(model, training, seq_len=args.smollm2_seq_len, max_windows=args.smollm2_windows,
                                skip_first=4, block=args.block,
                                execution=Execution(batch_size=args.smollm2_windows, progress=False))
    fitted = time.perf_counter() - start
    recipe = lenses.Recipe(steps=args.tuned_steps, tokens_per_step=512, seq_len=128)
    tuned = lenses.train(model, training, recipe, quiet)
    df = lenses.evaluate(model, held_out, [tuned, jlens], seq_len=128, max_tokens=args.eval_tokens, execution=quiet)
    tokens = args.smollm2_windows * args.smollm2_seq_len
    print(f"\nSmolLM2-135M (float32): J-lens fitted on {tokens} tokens in {fitted:.0f} s; tuned lens "
          f"{args.tuned_steps} steps x 512 tokens; KL(final || lens) in nats on {int(df['tokens'].iloc[0])} held-out "
          "tokens")
    table = df.pivot_table(index=["layer", "label"], columns="lens", values="kl", sort=False)
    print("| site | logit | tuned | jacobian |\n| --- | ---: | ---: | ---: |")
    for (_, label), row in table.iterrows():
        print(f"| {label} | {max(row['logit'], 0):.3f} | {max(row['tuned'], 0):.3f} | {max(row['jacobian'], 0):.3f} |")
    if args.figure:
        from resid.analyses import plots

        print("wrote", plots.save_html(lens_plots.evaluation(df), Path(args.figure)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--block", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of both fits (the same for both)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (median and fastest)")
    parser.add_argument("--folder", type=Path, default=None,
                        help="a transformers Llama folder to time instead of the random Llama (e.g. the SmolLM2 "
                             "layers make_jlens_reference.py saves in build/)")
    parser.add_argument("--smollm2-windows", type=int, default=2)
    parser.add_argument("--smollm2-seq-len", type=int, default=32)
    parser.add_argument("--tuned-steps", type=int, default=4)
    parser.add_argument("--eval-tokens", type=int, default=1024)
    parser.add_argument("--figure", default=None, help="the SmolLM2 figure (.html)")
    parser.add_argument("--reference", choices=["venv", "none"], default="venv")
    parser.add_argument("--smollm2", choices=["yes", "no"], default="yes")
    parser.add_argument("--venv", type=Path, default=ROOT / "build" / "jlens-venv")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    if args.reference == "venv":
        fitting(args)
    if args.smollm2 == "yes":
        smollm2(args)


if __name__ == "__main__":
    main()
