"""Training throughput on SmolLM2-135M (d_model 576, 30 layers): a TopK SAE (8x expansion, k=32) at one layer,
resid against SAELens (the issue's target: >= 2x SAELens's tokens/s at an FVU within 5% of SAELens's).

    python benchmarks/bench_train.py [--layer 15] [--steps 8] [--batch-size 4096] [--window 256] [--device cpu]
                                     [--held-out 8192] [--fvu-every 4] [--documents 2000] [--no-saelens]
                                     [--trainer-only] [--reuse-acts]
                                     [--transcoders] [--stream LAYERS]

SAELens runs in its own environment (build/saelens-reference-venv: torch 2.13.0 and sae-lens 6.54.12, made by
`python tests/data/make_saelens_training_reference.py`; --saelens-python names another), through
benchmarks/train_saelens.py, never inside resid's. Both libraries get the same torch, threads and hardware.

1. generate   activation generation alone: the demo corpus through the model in padded batches, the Site read
              at every real non-BOS token, shuffled (resid.analyses.training.activations): tokens/s. The first
              steps x batch-size tokens are the training rows, the next --held-out tokens the FVU's.
2. train      resid's optimizer steps (resid.analyses.training.trainer) on the training rows, every step timed, then
              SAELens's SAETrainer with its TopK SAE on the same rows in the same order (written to
              build/bench-train/acts.safetensors): tokens/s side by side, and each trained SAE's FVU and L0 on the
              held-out rows (one formula, sum (x - x^)^2 / sum (x - mean x)^2); with the held-out FVU of both
              every --fvu-every steps (not timed), the tokens and seconds each needs to reach the FVU both reach.
3. end to end resid.analyses.training.train for --steps steps (generation + training, one stream), then SAELens's
              LanguageModelSAETrainingRunner making its own activations of the same corpus and layer
              (model.layers.15): transformers loads the GGUF file resid loads and the runner is handed it as
              SAELens's HookedProxyLM (override_model) and the corpus as an in-memory dataset (override_dataset),
              since its own loaders read the model and data by Hugging Face Hub name and this machine has no Hub
              access. SAELens packs the documents into contexts of --window tokens, --saelens-prompts of them per
              forward; resid runs windows (documents, cut at --window tokens) longest first, at most
              --forward-batch x --window padded tokens per forward: the line before the table gives each one's
              tokens per forward.
4. --transcoders: 30 transcoders (every layer's MLP standardized input to its write) from one forward pass against
   30 separate runs (each stops after its own layer): generation timed both ways, the training steps once.
5. --stream LAYERS: resid.analyses.training.train of BatchTopK transcoders (2x, k=16, bench_gpu.py's training
   workload) at the first LAYERS layers from one stream, end to end, the model in fp32 and then in bf16.

Each comparison prints resid / SAELens tokens/s, the FVU gap relative to SAELens's, and whether the target is met.
The recipes differ where each library's TopK recipe does (resid: sparsify's, unit-norm decoder rows, b_dec at the
geometric median; SAELens: its TopK defaults, see train_saelens.py). resid trains at its recipe's default learning
rate; SAELens on the same activations at each of --saelens-lrs (3e-4, its default, 1e-3 and 3e-3) and is compared at
the best of them (its tokens/s does not depend on the rate), end to end at its default 3e-4 (--saelens-lr); no
warm-up, the same steps, batch and forward batch (--saelens-prompts defaults to --forward-batch). The equal-FVU
ratio reads each run's held-out FVU curve (every --fvu-every steps) where it first crosses the FVU both reach,
linearly between measurements. Measured so (2-core AVX-512 CPU at 431 GFLOP/s, torch 2.13.0, 2 threads each, quiet;
--steps 48 --batch-size 2048 --held-out 4096 --forward-batch 32): training on the same activations resid 11,271
tokens/s, SAELens 6,052 (1.86x); end to end resid 2,014, SAELens 1,442 (1.40x; with --autocast 3,516 and 3,405,
1.03x); held-out FVU after 48 steps resid 0.513, SAELens 1.642 (unconverged at its learning rate). At equal FVU
(--steps 256 --batch-size 2048 --held-out 4096 --forward-batch 32 --fvu-every 16 --documents 0 --trainer-only):
resid 10,639 tokens/s, SAELens 5,717; SAELens's final FVU 0.364 is reached by resid after 294,912 tokens (27.7 s)
and by SAELens after 524,288 (91.7 s), 3.31x, against SAELens's default learning rate; at the best of the sweep
(3e-3; --steps 56 --documents 2000) SAELens reaches resid's FVU in 0.39x the tokens, and resid is 0.80x at equal
FVU (README). Generation is most of the end-to-end time (resid's alone: 2,550
tokens/s in fp32, 5,228 in bf16 autocast). --transcoders --batch-size 4096 --steps 3 (measured earlier, on a 165
GFLOP/s machine): 30 BatchTopK transcoders (8x, k=32), 8,192 tokens each: generation 15.1 s from one forward against
196.5 s from 30 runs (13x); with the training steps, 125 against 33 tokens/s (3.8x).
"""

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from timing import matmul_gflops

import resid
from resid.analyses import corpus
from resid.analyses.distributed.execution import Execution
from resid.analyses.training.activations import Activations, forward_batches
from resid.analyses.training.loop import Spec, train
from resid.analyses.training.recipe import Recipe
from resid.analyses.training.trainer import Trainer
from resid.load.registry import smollm2_path
from resid.sites import Site

ROOT = Path(__file__).resolve().parents[1]


SAELENS_LR = 3e-4  # SAELens 6's default learning rate (LanguageModelSAERunnerConfig.lr, SAETrainerConfig.lr)
SAELENS_SWEEP = "3e-4,1e-3,3e-3"  # its default and two larger ones: TopK SAEs at this batch converge faster there


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layer", type=int, default=15)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--forward-batch", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--transcoders", action="store_true",
                        help="instead: 30 transcoders from one forward pass against 30 separate runs")
    parser.add_argument("--stream", type=int, default=None, metavar="LAYERS",
                        help="instead: train() of transcoders at the first LAYERS layers from one stream, end to end, "
                             "with the model in fp32 and in bf16 (the GPU workload's recipe, bench_gpu.py)")
    parser.add_argument("--autocast", action="store_true",
                        help="both run the model under bf16 autocast (resid's autocast, SAELens's autocast_lm)")
    parser.add_argument("--held-out", type=int, default=8192, help="tokens the FVU is measured on")
    parser.add_argument("--documents", type=int, default=2000,
                        help="documents of the demo corpus read (0: all 12,134, about 800k tokens in windows of 256)")
    parser.add_argument("--fvu-every", type=int, default=4,
                        help="training on the same activations: the held-out FVU every this many steps (outside the "
                             "timed steps), for the tokens each library needs to reach the same FVU")
    parser.add_argument("--no-saelens", action="store_true", help="skip the SAELens comparison")
    parser.add_argument("--reuse-acts", action="store_true",
                        help="train on the rows an earlier run wrote to --acts instead of generating them (with "
                             "--trainer-only: a rerun of the trainers' comparison on a quieter machine)")
    parser.add_argument("--trainer-only", action="store_true",
                        help="only generation and training on the same activations (no end-to-end runs): for long "
                             "runs measuring the tokens each library needs to reach one FVU")
    parser.add_argument("--saelens-prompts", type=int, default=None,
                        help="end to end: SAELens's store_batch_size_prompts, contexts of --window tokens per forward "
                             "(default: --forward-batch, resid's windows per forward: the same forward batch)")
    parser.add_argument("--saelens-lr", type=float, default=SAELENS_LR,
                        help="SAELens's learning rate end to end (default: its own default, not resid's)")
    parser.add_argument("--saelens-lrs", default=SAELENS_SWEEP,
                        help="training on the same activations: SAELens at each of these learning rates "
                             "(comma-separated), compared at the one whose held-out FVU is best")
    parser.add_argument("--saelens-python", type=Path, default=ROOT / "build" / "saelens-reference-venv" / "bin" /
                        "python", help="SAELens's environment (tests/data/make_saelens_training_reference.py makes it)")
    parser.add_argument("--acts", type=Path, default=ROOT / "build" / "bench-train" / "acts.safetensors",
                        help="where the activations SAELens trains on are written")
    args = parser.parse_args()
    if args.saelens_prompts is None:  # the same forward batch as resid's unless asked otherwise
        args.saelens_prompts = args.forward_batch

    texts = corpus.demo(max_documents=args.documents or None)
    if args.stream is not None:  # that measurement alone
        return _stream(texts, args)
    model = resid.load("smollm2-135m", device=args.device)
    site = Site(args.layer, "resid_post")
    buffer_tokens = (args.steps + 1) * args.batch_size
    recipe = Recipe(activation="topk", expansion=8, k=32, steps=args.steps, batch_size=args.batch_size,
                    warmup_steps=0)
    print(f"SmolLM2-135M on {args.device}, {torch.get_num_threads()} threads; TopK SAE 8x (d_sae 4608) k=32 at "
          f"{site.label}; batch {args.batch_size} tokens, windows of {args.window}, at most {args.forward_batch} x "
          f"{args.window} padded tokens per forward; the model in {'bf16 autocast' if args.autocast else 'fp32'}")
    print(f"this CPU's fp32 matrix-multiply rate (2048 x 2048 products, {torch.get_num_threads()} threads): "
          f"{matmul_gflops():.0f} GFLOP/s, the ceiling of generation's forwards")

    if args.transcoders:  # that comparison alone
        return _transcoders(model, texts, args)
    tokens = args.steps * args.batch_size
    source = Activations(model, texts, [site], args.batch_size, args.window, args.forward_batch,
                         tokens + args.held_out, autocast=args.autocast)
    point = source.points[0]
    if args.reuse_acts:  # the rows a previous run generated and wrote for SAELens
        saved = load_file(str(args.acts))
        block = torch.cat([saved["train"], saved["held_out"]]).to(args.device)
        if len(saved["train"]) != tokens:
            sys.exit(f"{args.acts} holds {len(saved['train'])} training rows, not {tokens}: run with the --steps and "
                     f"--batch-size that wrote it, or without --reuse-acts")
        print(f"reusing the {len(block)} rows in {args.acts} (no generation)")
    else:
        start = time.perf_counter()
        block = source.block(0)[point]
        _sync(args.device)
        generate = time.perf_counter() - start
        print(f"generate   {len(block):>8} tokens in {generate:7.2f} s: {len(block) / generate:9.0f} tokens/s")
    if len(block) < tokens + args.held_out:
        sys.exit(f"the corpus gave {len(block)} tokens, fewer than --steps x --batch-size + --held-out = "
                 f"{tokens + args.held_out}: read more documents (--documents 0: all) or train fewer steps")
    train_rows, held_out = block[:tokens], block[tokens:tokens + args.held_out]

    trainer = Trainer.new(recipe, model.config.d_model, device=args.device)
    seconds, curve = 0.0, []  # every step timed, the first (b_dec's geometric median) included, as SAELens's fit()
    for i in range(args.steps):
        if i and i % args.fvu_every == 0:  # the held-out FVU so far, outside the timed steps
            curve.append((i * args.batch_size, _held_out(trainer.coder.dictionary(point.name), held_out)["fvu"]))
        _sync(args.device)
        start = time.perf_counter()
        trainer.step(train_rows[i * args.batch_size:(i + 1) * args.batch_size])
        _sync(args.device)
        seconds += time.perf_counter() - start
    ours = {"seconds": seconds, **_held_out(trainer.coder.dictionary(point.name), held_out)}
    ours["tokens_per_s"] = tokens / ours["seconds"]
    ours["curve"] = [*curve, (tokens, ours["fvu"])]
    print(f"train      {tokens:>8} tokens in {ours['seconds']:7.2f} s: {ours['tokens_per_s']:9.0f} tokens/s "
          f"(held-out FVU {ours['fvu']:.4f}, L0 {ours['l0']:.1f})")
    if not args.no_saelens:
        peer = _best_saelens(args, {"train": train_rows, "held_out": held_out})
        _compare(ours, peer, tokens, args)
    del block, train_rows  # held_out stays, for the end-to-end FVUs
    if args.trainer_only:
        return

    start = time.perf_counter()
    sae, = train(model, texts, [site], recipe, Execution(batch_size=args.forward_batch, progress=False,
                                                         device=args.device),
                 window=args.window, buffer_tokens=buffer_tokens, autocast=args.autocast)
    _sync(args.device)
    ours = {"seconds": time.perf_counter() - start, **_held_out(sae, held_out)}
    ours["tokens_per_s"] = tokens / ours["seconds"]
    print(f"end to end {tokens:>8} tokens in {ours['seconds']:7.2f} s: {ours['tokens_per_s']:9.0f} tokens/s "
          f"(held-out FVU {ours['fvu']:.4f}, L0 {ours['l0']:.1f})")
    if not args.no_saelens:
        lengths = sorted((len(w) for w in source.windows_of(0)), reverse=True)
        spans = forward_batches(lengths, args.forward_batch * args.window)
        real, slots = sum(lengths), sum((end - start) * lengths[start] for start, end in spans)
        print(f"tokens per forward: resid at most {args.forward_batch} x {args.window} padded, {real / len(spans):.0f} "
              f"real tokens on average ({slots / real:.2f}x that in padded positions), SAELens "
              f"{args.saelens_prompts} contexts x {args.window} tokens")
        texts_file = args.acts.with_name("texts.json")
        texts_file.write_text(json.dumps(texts))
        peer = _saelens(args, None, args.saelens_lr, [
            "--gguf", str(smollm2_path()), "--tokenizer", str(ROOT / "tests" / "data" / "smollm2-135m"),
            "--texts", str(texts_file), "--steps", str(args.steps), "--layer", str(args.layer),
            "--context-size", str(args.window), "--store-batch-prompts", str(args.saelens_prompts),
            # a buffer of about resid's buffer_tokens (SAELens's default, 20 batches of prompts, may be larger)
            "--batches-in-buffer", str(max(2, -(-buffer_tokens // (args.saelens_prompts * args.window)))),
            *(["--autocast"] if args.autocast else [])])
        _compare(ours, peer, tokens, args)



def _transcoders(model, texts, args) -> None:
    """30 BatchTopK transcoders (8x, k=32) trained on one block of tokens: every layer's hooks from one forward
    pass, then each transcoder's steps; against 30 separate runs, layer l's alone (a forward up to layer l, its
    steps). The steps cost the same either way, so they are timed once, on one transcoder, and counted 30 times."""
    n = model.config.n_layers
    specs = [Spec.transcoder(model, layer) for layer in range(n)]
    recipe = Recipe(activation="batchtopk", expansion=8, k=32, steps=1, batch_size=args.batch_size, warmup_steps=0,
                    normalize="expected_average_only_in")  # as resid train-transcoder

    def generate(points):
        source = Activations(model, texts, points, args.batch_size, args.window, args.forward_batch,
                             args.steps * args.batch_size, autocast=args.autocast)
        start = time.perf_counter()
        found = source.block(0)
        _sync(args.device)
        return found, time.perf_counter() - start

    pairs = [s.points(model) for s in specs]
    found, together = generate([p for pair in pairs for p in pair])
    point_in, point_out = pairs[0]
    generated = len(found[point_in])
    tokens = generated // args.batch_size * args.batch_size
    share = tokens / generated  # generation is counted for the tokens trained on (the block holds a few more)
    trainer = Trainer.new(recipe, model.config.d_model, transcoder=True, device=args.device)
    start = time.perf_counter()
    for i in range(0, tokens, args.batch_size):
        trainer.step(found[point_in][i:i + args.batch_size], found[point_out][i:i + args.batch_size])
    _sync(args.device)
    steps = time.perf_counter() - start
    alone = share * sum(generate(list(pair))[1] for pair in pairs)
    together *= share
    one, separate = together + n * steps, alone + n * steps
    print(f"\n{n} transcoders (BatchTopK 8x k=32), {tokens} tokens each: generation from one forward {together:.2f} s, "
          f"from {n} separate runs (layer l's forward stops after layer l) {alone:.2f} s; training steps "
          f"{steps:.2f} s per transcoder")
    print(f"tokens/s of all {n} transcoders: one forward {tokens / one:.0f}, {n} separate runs {tokens / separate:.0f} "
          f"({separate / one:.2f}x)")


def _stream(texts, args) -> None:
    """resid.analyses.training.train of BatchTopK transcoders (2x, k=16: bench_gpu.py's training workload) at the
    first --stream layers from one stream, end to end (generation and steps), the model in fp32 then in bf16: the
    tokens/s of each, and how much of it is generation (Activations.block alone, timed after)."""
    recipe = Recipe(activation="batchtopk", k=16, expansion=2, steps=args.steps, batch_size=args.batch_size,
                    warmup_steps=max(1, args.steps // 6), threshold_start_step=max(1, args.steps // 3))
    buffer_tokens = (args.steps + 1) * args.batch_size
    print(f"SmolLM2-135M on {args.device}, {torch.get_num_threads()} threads: {args.stream} BatchTopK transcoders (2x, "
          f"k=16) from one stream, {args.steps} steps x {args.batch_size} tokens, forward batch {args.forward_batch} "
          f"x {args.window}")
    for dtype in (torch.float32, torch.bfloat16):
        model = resid.load("smollm2-135m", device=args.device, dtype=dtype)
        specs = [Spec.transcoder(model, layer) for layer in range(args.stream)]
        start = time.perf_counter()
        train(model, texts, specs, recipe, Execution(batch_size=args.forward_batch, progress=False, device=args.device),
              window=args.window, buffer_tokens=buffer_tokens)
        _sync(args.device)
        seconds = time.perf_counter() - start
        source = Activations(model, texts, [p for s in specs for p in s.points(model) if p is not None],
                             args.batch_size, args.window, args.forward_batch, buffer_tokens)
        start = time.perf_counter()
        source.block(0)
        _sync(args.device)
        generate = time.perf_counter() - start
        tokens = args.steps * args.batch_size
        print(f"{str(dtype).removeprefix('torch.'):>9}: {tokens / seconds:8.0f} tokens/s end to end ({seconds:.2f} s "
              f"for {tokens} tokens; generating the block alone {generate:.2f} s)", flush=True)


def _held_out(dictionary, rows) -> dict:
    """FVU (sum (x - x^)^2 / sum (x - mean x)^2) and mean L0 on the held-out rows: train_saelens.py's formula."""
    with torch.no_grad():
        acts, recon = dictionary.to(rows.device)(rows)
    return {"fvu": float((rows - recon).pow(2).sum() / (rows - rows.mean(0)).pow(2).sum()),
            "l0": float((acts > 0).sum(-1).float().mean())}


def _saelens(args, tensors: dict | None, lr: float, extra: list[str] = ()) -> dict:
    """SAELens on the rows in `tensors` (written to args.acts; None: those written before), or end to end with
    `extra` (benchmarks/train_saelens.py, in SAELens's environment): its JSON."""
    if not args.saelens_python.exists():
        sys.exit(f"{args.saelens_python} is missing: make it with tests/data/make_saelens_training_reference.py "
                 "(or pass --saelens-python, or --no-saelens)")
    if tensors is not None:
        args.acts.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.cpu().contiguous() for k, v in tensors.items()}, str(args.acts))
    command = [str(args.saelens_python), str(ROOT / "benchmarks" / "train_saelens.py"), str(args.acts),
               "--expansion", "8", "--k", "32", "--batch-size", str(args.batch_size), "--lr", repr(lr),
               "--warmup-steps", "0", "--device", args.device, "--fvu-every", str(args.fvu_every), *extra]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _best_saelens(args, tensors: dict) -> dict:
    """SAELens on the same rows at each learning rate of --saelens-lrs: the run with the best held-out FVU (its
    tokens/s does not depend on the rate), after printing every rate's."""
    runs = []
    for i, lr in enumerate(float(x) for x in args.saelens_lrs.split(",")):
        run = _saelens(args, tensors if i == 0 else None, lr)  # the rows are written once
        print(f"SAELens at lr {lr:g}: {run['tokens_per_s']:.0f} tokens/s, held-out FVU {run['fvu']:.4f}, "
              f"L0 {run['l0']:.1f}")
        runs.append({**run, "lr": lr})
    best = min(runs, key=lambda run: run["fvu"])
    print(f"SAELens compared at its best learning rate of {len(runs)}: {best['lr']:g}")
    return best


def _compare(ours: dict, peer: dict, tokens: int, args) -> None:
    trainer = peer["mode"] == "trainer"
    what = "training on the same activations" if trainer else "end to end: activations made by each library"
    print(f"\n{what}: TopK SAE 8x k=32, {tokens} tokens = {args.steps} steps x {args.batch_size}"
          f"{', the same rows in the same order' if trainer else ''}, {torch.get_num_threads()} / {peer['threads']} "
          f"threads; FVU and L0 on the same {args.held_out} held-out tokens")
    print(f"{'':28}{'tokens/s':>10}{'seconds':>9}{'FVU':>9}{'L0':>7}")
    for label, row in (("resid", ours), (f"{peer['library']} {peer['mode']}", peer)):
        print(f"{label:28}{row['tokens_per_s']:>10.0f}{row['seconds']:>9.2f}{row['fvu']:>9.4f}{row['l0']:>7.1f}")
    speed, gap = ours["tokens_per_s"] / peer["tokens_per_s"], (ours["fvu"] - peer["fvu"]) / peer["fvu"]
    met = speed >= 2 and gap <= 0.05
    print(f"resid / SAELens: {speed:.2f}x tokens/s, FVU {gap:+.1%} relative; the issue's target (>= 2x tokens/s at "
          f"FVU within 5%): {'met' if met else 'not met'}")
    if trainer:
        _equal_fvu(ours, peer)
    print()


def _equal_fvu(ours: dict, peer: dict) -> None:
    """The held-out FVU of each run along its training, and the tokens and seconds (at its tokens/s) each needs
    to reach the FVU that both reach (the higher of the two final FVUs): the tokens where the curve first crosses
    it, interpolated linearly between the two measurements around the crossing (measured every --fvu-every
    steps), so that the ratio is not rounded to a whole --fvu-every block."""
    print("held-out FVU along training (tokens: resid, SAELens): " + ", ".join(
        f"{t}: {a:.3f}, {b:.3f}" for (t, a), (_, b) in zip(ours["curve"], peer["curve"])))
    target = max(ours["fvu"], peer["fvu"])
    reach = {"resid": _crossing(ours["curve"], target), "SAELens": _crossing(peer["curve"], target)}
    seconds = {name: reach[name] / run["tokens_per_s"] for name, run in (("resid", ours), ("SAELens", peer))}
    ratio = seconds["SAELens"] / seconds["resid"]
    print(f"to reach FVU {target:.3f}: resid {reach['resid']:.0f} tokens in {seconds['resid']:.2f} s, SAELens "
          f"{reach['SAELens']:.0f} tokens in {seconds['SAELens']:.2f} s: resid {ratio:.2f}x faster at equal FVU")


def _crossing(curve: list, target: float) -> float:
    """The tokens at which a (tokens, FVU) curve first reaches `target`, linear between measurements."""
    before = (0, float("inf"))
    for tokens, fvu in curve:
        if fvu <= target:
            (t0, f0), (t1, f1) = before, (tokens, fvu)
            if not math.isfinite(f0) or f0 == f1:
                return float(t1)
            return t0 + (t1 - t0) * (f0 - target) / (f0 - f1)
        before = (tokens, fvu)
    return float(curve[-1][0])  # the target is the higher final FVU, so both curves reach it by their end


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
