"""Edge-circuit benchmark (resid.analyses.circuits) on SmolLM2-135M with IOI pairs, one process, side by side:

    python benchmarks/bench_circuits.py [--pairs 64] [--batch 16] [--steps 5] [--sizes 20] [--curve-pairs 32]
                                        [--exact-edges 200|all] [--exact-pairs 8] [--out-dir out/circuits]
                                        [--stages eap,eap_ig,curve,exact,tables] [--whole]
    python benchmarks/bench_circuits.py --circuitkit [--pairs 8]     # vs circuitkit 0.2.0 on a GPT-2-small shape

Pairs: bench_ablation's IOI prompts (one token length), corrupt the same with the second mention of B replaced by A
(bench_patching.corrupt_of), metric logit(A) - logit(B) at the last token.
  forward_backward  one batch: a plain forward with gradients on, the metric, a backward pass (the unit of EAP)
  eap               resid.analyses.circuits.eap over every edge (30 layers: 301 writers x 481 readers), per batch
                    (target <= 3 forward_backward)
  eap_ig            5 steps on the inputs, per batch and step (target <= 2 x eap per batch)
  curve             the faithfulness curve of `--sizes` top-k circuits (log-spaced edge fractions to 1) of
                    `--curve-pairs` pairs vs as many plain forwards of those pairs (target <= 1x: one forward per
                    circuit size); with --whole also without the shared prefix (circuits.prefix: every position
                    run, as for pairs that differ from their first token on)
  exact             resid.analyses.circuits.exact of the `--exact-edges` edges EAP-IG ranks highest (or all of
                    them: resumable, its rows in --out-dir/exact.parquet), `--exact-pairs` pairs: the ground truth
                    of the exact top-k curve (with a number, the other edges scored 0)
  tables            the faithfulness curves (MIB's 10 fractions) of EAP, EAP-IG and exact top-k, with CPR and CMD:
                    a table (CSV and Markdown) and the EAP-IG circuit at the smallest size of faithfulness >= 0.8
                    drawn (HTML), under --out-dir (needs the eap, eap_ig and exact stages)
The curve and exact stages rank the edges by EAP-IG, or by EAP where eap_ig is not run.

--circuitkit: circuitkit's get_scores_eap / get_scores_eap_ig (TransformerLens, in build/eap-reference-venv; see
tests/data/make_eap_reference.py) vs resid's on one random GPT-2-small-shaped model (12 layers, 12 heads, d_model
768, the same weights), time and peak resident memory of each in its own process.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / "build" / "eap-reference-venv" / "bin" / "python"
STAGES = ("eap", "eap_ig", "curve", "exact", "tables")


def timed(fn, repeats: int = 1):
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def smollm2(args) -> None:
    from bench_ablation import make_prompts
    from bench_patching import corrupt_of

    import resid
    from resid.analyses import Execution, circuits, tables
    from resid.analyses.circuits.figure import page
    from resid.analyses.metrics import metric_values

    model = resid.load("smollm2-135m")
    graph = circuits.EdgeGraph.of(model.config)
    clean, targets, baselines = make_prompts(model, args.pairs)
    corrupt = corrupt_of(clean, targets, baselines)
    quiet = Execution(progress=False, batch_size=args.batch)
    n_pos = model.to_tokens(clean[:1]).ids.shape[1]
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}; {args.pairs} pairs x {n_pos} tokens, batch "
          f"{args.batch}; {graph.n_edges} edges ({len(graph.writers)} writers x {len(graph.readers)} readers)")
    batches = -(-args.pairs // args.batch)
    ids = model.to_tokens(clean[: args.batch])
    t = torch.tensor([model.to_single_token(x) for x in targets[: args.batch]])
    b = torch.tensor([model.to_single_token(x) for x in baselines[: args.batch]])

    def forward_backward():
        model.zero_grad(set_to_none=True)
        logits = model.run(ids, logits_at="last", grad=True).logits[:, 0]
        metric_values("logit_diff", logits, t, b).sum().backward()

    stages = set(args.stages.split(","))
    unknown = stages - set(STAGES)
    if unknown:
        sys.exit(f"unknown stages {sorted(unknown)}; choose from {','.join(STAGES)}")
    eap = ig = exact = None
    if stages & {"eap", "eap_ig"}:
        fb_s, _ = timed(forward_backward, repeats=2)
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            fwd_s, _ = timed(lambda: model.run(ids, logits_at="last"), repeats=2)
        print(f"forward_backward (one batch)   {fb_s:8.2f} s   forward {fwd_s:.2f} s")
    if "eap" in stages or "eap_ig" in stages:
        eap_s, eap = timed(lambda: circuits.eap(model, clean, corrupt, targets, baselines, execution=quiet))
        print(f"eap, per batch                 {eap_s / batches:8.2f} s   {eap_s / batches / fb_s:.2f}x "
              "forward_backward (target <= 3)")
    if "eap_ig" in stages:
        ig_s, ig = timed(lambda: circuits.eap_ig(model, clean, corrupt, targets, baselines, steps=args.steps,
                                                 execution=quiet))
        print(f"eap_ig {args.steps} steps, per batch step  {ig_s / batches / args.steps:8.2f} s   "
              f"{ig_s / batches / args.steps / (eap_s / batches):.2f}x eap per batch (target <= 2)")
    ranking = ig if ig is not None else eap
    if ranking is None and stages & {"curve", "exact", "tables"}:  # the circuits' ranking, untimed
        ranking = circuits.eap(model, clean, corrupt, targets, baselines, execution=quiet)

    curve_pairs = slice(0, args.curve_pairs)
    c_args = (clean[curve_pairs], corrupt[curve_pairs], targets[curve_pairs])
    if "curve" in stages:
        fractions = np.geomspace(1 / graph.n_edges * 10, 1.0, args.sizes).tolist()
        curve_ids = model.to_tokens(clean[curve_pairs])
        with torch.no_grad():
            curve_fwd_s, _ = timed(lambda: model.run(curve_ids, logits_at="last"), repeats=2)
        curve_s, _ = timed(lambda: circuits.faithfulness_curve(model, *c_args, ranking, baselines[curve_pairs],
                                                               fractions=fractions, execution=quiet))
        print(f"curve, {args.sizes} sizes x {args.curve_pairs} pairs {curve_s:8.2f} s   "
              f"{curve_s / (args.sizes * curve_fwd_s):.2f}x {args.sizes} forwards of those pairs (target <= 1)")
        if args.whole:  # the same without the shared prefix: as pairs that differ from their first token on
            from unittest import mock

            from resid.analyses.circuits.prefix import SharedPrefix

            with mock.patch.object(SharedPrefix, "of", return_value=None):
                whole_s, _ = timed(lambda: circuits.faithfulness_curve(
                    model, *c_args, ranking, baselines[curve_pairs], fractions=fractions, execution=quiet))
            print(f"curve, every position run      {whole_s:8.2f} s   "
                  f"{whole_s / (args.sizes * curve_fwd_s):.2f}x {args.sizes} forwards of those pairs")

    if "exact" in stages:
        every = args.exact_edges == "all"
        top = None if every else ranking.sort_values("abs_score", ascending=False).head(int(args.exact_edges))
        exact_pairs = slice(0, args.exact_pairs)
        # every edge: half an hour for 4 pairs on SmolLM2, resumable (each batch's rows kept as it is done)
        store = str(Path(args.out_dir) / "exact.parquet")
        execution = Execution(progress=True, batch_size=args.batch, out=store) if every else quiet
        exact_s, exact = timed(lambda: circuits.exact(
            model, clean[exact_pairs], corrupt[exact_pairs], targets[exact_pairs], baselines[exact_pairs],
            edges=None if every else list(zip(top["writer"], top["reader"])), execution=execution))
        print(f"exact, {args.exact_edges} edges x {args.exact_pairs} pairs   {exact_s:8.2f} s")
        exact = exact.fillna({"score": 0.0, "abs_score": 0.0})
    if "tables" not in stages:
        return
    if eap is None or ig is None or exact is None:
        sys.exit("the tables stage needs the eap, eap_ig and exact stages")

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows, curves = [], []
    for name, scores in (("EAP", eap), (f"EAP-IG ({args.steps} steps)", ig), ("exact top-k", exact)):
        curve = circuits.faithfulness_curve(model, *c_args, scores, baselines[curve_pairs], execution=quiet)
        curve["method"] = name
        curves.append(curve)
        rows.append({"method": name, "CPR": circuits.cpr(curve), "CMD": circuits.cmd(curve),
                     **{f"f@{f:g}": v for f, v in zip(curve["fraction"], curve["faithfulness"])}})
    summary = pd.DataFrame(rows)
    tables.export(pd.concat(curves, ignore_index=True), out / "curves.csv")
    tables.export(summary, out / "summary.md")
    tables.export(summary, out / "summary.csv")
    print(summary.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    ig_curve = curves[1]
    reached = ig_curve[ig_curve["faithfulness"] >= 0.8]
    k = int((reached if len(reached) else ig_curve).iloc[0 if len(reached) else -1]["k"])
    matrix = circuits.matrix(graph, ig)
    mask = circuits.top_k(graph, matrix, k)
    figure = page(graph, mask, matrix, out / "circuit.html",
                  f"SmolLM2-135M IOI, EAP-IG top {k} edges ({int(mask.sum())} after pruning)")
    print(f"tables -> {out}/summary.md, curves.csv; circuit -> {figure}")


def circuitkit_side(folder: str, pairs: int, steps: int) -> None:
    """Inside the reference venv: circuitkit's EAP and EAP-IG times on the model in `folder` (one JSON line)."""
    from circuitkit.backends.eap.attribute import get_scores_eap, get_scores_eap_ig
    from circuitkit.backends.eap.eap_utils import collate_EAP
    from circuitkit.backends.eap.graph import Graph
    from torch.utils.data import DataLoader
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(folder).eval()
    c = hf.config
    cfg = HookedTransformerConfig(n_layers=c.n_layer, d_model=c.n_embd, d_head=c.n_embd // c.n_head, n_heads=c.n_head,
                                  d_mlp=4 * c.n_embd, d_vocab=c.vocab_size, n_ctx=c.n_positions, act_fn="gelu_new",
                                  normalization_type="LN", positional_embedding_type="standard",
                                  original_architecture="GPT2LMHeadModel", tokenizer_name=folder,
                                  default_prepend_bos=True, dtype=torch.float32, device="cpu")
    model = HookedTransformer(cfg)
    model.load_and_process_state_dict(convert_gpt2_weights(hf, cfg), fold_ln=False, center_writing_weights=False,
                                      center_unembed=False, fold_value_biases=False,
                                      refactor_factored_attn_matrices=False)
    model.set_use_attn_result(True)
    model.set_use_split_qkv_input(True)
    model.set_use_hook_mlp_in(True)
    data = json.loads(Path(folder, "pairs.json").read_text())
    loader = DataLoader([(a, b, lab) for a, b, lab in zip(data["clean"], data["corrupt"], data["labels"])],
                        batch_size=pairs, collate_fn=collate_EAP)

    def metric(logits, clean_logits, lengths, labels):
        rows = torch.arange(logits.shape[0])
        last = logits[rows, lengths - 1]
        return (last[rows, labels[:, 0]] - last[rows, labels[:, 1]]).sum()

    eap_s, _ = timed(lambda: get_scores_eap(model, Graph.from_model(model), loader, metric, quiet=True))
    ig_s, _ = timed(lambda: get_scores_eap_ig(model, Graph.from_model(model), loader, metric, steps=steps,
                                              quiet=True))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"eap_s": eap_s, "eap_ig_s": ig_s, "peak_mb": peak}))


def resid_side(folder: str, pairs: int, steps: int) -> None:
    import resid
    from resid.analyses import Execution, circuits

    model = resid.load(folder)
    data = json.loads(Path(folder, "pairs.json").read_text())
    ids = torch.tensor(data["ids_clean"]), torch.tensor(data["ids_corrupt"])
    labels = torch.tensor(data["labels"])
    options = dict(baselines=labels[:, 1].tolist(), execution=Execution(progress=False, batch_size=pairs))
    eap_s, _ = timed(lambda: circuits.eap(model, *ids, labels[:, 0].tolist(), **options))
    ig_s, _ = timed(lambda: circuits.eap_ig(model, *ids, labels[:, 0].tolist(), steps=steps, **options))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"eap_s": eap_s, "eap_ig_s": ig_s, "peak_mb": peak}))


def vs_circuitkit(args) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    if not VENV.exists():
        sys.exit(f"no {VENV}: run python tests/data/make_eap_reference.py first (it builds circuitkit's venv)")
    with tempfile.TemporaryDirectory() as folder:
        torch.manual_seed(0)
        hf = GPT2LMHeadModel(GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=64, vocab_size=1000))
        hf.save_pretrained(folder, safe_serialization=True)
        vocab = {"<bos>": 0, **{f"t{i}": i for i in range(1, 1000)}}
        raw = Tokenizer(models.WordLevel(vocab, unk_token="<bos>"))
        raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<bos>", pad_token="<bos>").save_pretrained(folder)
        (Path(folder) / "tokenizer_config.json").exists()
        g = torch.Generator().manual_seed(1)
        clean = torch.randint(1, 1000, (args.pairs, 14), generator=g)
        corrupt = clean.clone()
        corrupt[:, 3] = torch.randint(1, 1000, (args.pairs,), generator=g)
        labels = torch.randint(1, 1000, (args.pairs, 2), generator=g)
        text = lambda x: [" ".join(f"t{int(i)}" for i in row) for row in x]  # noqa: E731
        bos = torch.zeros(args.pairs, 1, dtype=torch.long)
        Path(folder, "pairs.json").write_text(json.dumps({
            "clean": text(clean), "corrupt": text(corrupt), "labels": labels.tolist(),
            "ids_clean": torch.cat([bos, clean], 1).tolist(), "ids_corrupt": torch.cat([bos, corrupt], 1).tolist()}))
        results = {}
        for side, python in (("circuitkit", str(VENV)), ("resid", sys.executable)):
            done = subprocess.run([python, __file__, f"--{side}-side", folder, "--pairs", str(args.pairs),
                                   "--steps", str(args.steps)], check=True, capture_output=True, text=True)
            results[side] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"GPT-2-small shape (random weights), {args.pairs} pairs x 15 tokens, one batch, CPU threads "
          f"{torch.get_num_threads()}")
    for name in ("eap_s", "eap_ig_s", "peak_mb"):
        a, b = results["circuitkit"][name], results["resid"][name]
        print(f"{name:>9}: circuitkit {a:9.2f}   resid {b:9.2f}   ({a / b:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--sizes", type=int, default=20)
    parser.add_argument("--curve-pairs", type=int, default=32)
    parser.add_argument("--exact-edges", default="200", help="how many of the top edges, or all")
    parser.add_argument("--exact-pairs", type=int, default=8)
    parser.add_argument("--out-dir", default="out/circuits")
    parser.add_argument("--stages", default=",".join(STAGES), help="which stages to run (comma-separated)")
    parser.add_argument("--whole", action="store_true", help="time the curve without the shared prefix too")
    parser.add_argument("--circuitkit", action="store_true")
    parser.add_argument("--circuitkit-side", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--resid-side", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.circuitkit_side:
        circuitkit_side(args.circuitkit_side, args.pairs, args.steps)
    elif args.resid_side:
        resid_side(args.resid_side, args.pairs, args.steps)
    elif args.circuitkit:
        vs_circuitkit(args)
    else:
        smollm2(args)


if __name__ == "__main__":
    main()
