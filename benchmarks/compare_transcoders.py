"""Per-layer, skip and cross-layer transcoders of one model trained side by side on the same activations, for the
README's comparison: one stream of the corpus through the model (resid.analyses.training's Activations and step
job), each batch stepping every kind's trainers on the very same rows, so the token budget and the data are equal by
construction. The recipe is `resid train-transcoder`'s / `resid train-clt`'s for --tokens and --batch-size
(BatchTopK, warm-up 5% and decay 20% of the steps, the exported threshold a moving average over a quarter of them
(at most 1000), normalize expected_average_only_in, dead after a tenth of the budget; --dead-tokens 10000000 leaves
AuxK out of the per-layer kinds, as the CLT trains without it), on the training side of the demo corpus's held-out
split (`--held-out 0.1`, as the CLI splits it).

    python benchmarks/compare_transcoders.py --out build/compare --kinds per-layer,skip,clt --tokens 262144 \\
        --batch-size 2048 --expansion 2 --k 16

Writes OUT/<kind>/ (per-layer and skip: one SAELens folder per layer, as `resid train-transcoder` writes them; clt:
OUT/clt/clt/ in circuit-tracer's layout, as `resid train-clt`), which `resid eval-dictionaries` then compares:

    resid eval-dictionaries per-layer=OUT/per-layer skip=OUT/skip clt=OUT/clt/clt --out OUT/eval --prompt ...

Not resumable (no checkpoints): a kill loses the run. Prints each kind's tokens/s share of the step time at the end.

On a GPU (gpu_check.sh's `transcoders` stage), for a fixed time at an equal token budget, scored at once:

    python benchmarks/compare_transcoders.py --device cuda --weights auto --kinds per-layer,clt --seconds 60 \\
        --evaluate --results OUT/results.jsonl

--weights auto: the GGUF where its package is installed, else random weights of its shapes (gpu_models.py; the
records say which). --seconds S instead of --tokens: a probe of a few steps times each kind's optimizer step and
the forward passes that feed them all, and the budget is the batches the whole side-by-side run makes in about S
seconds, so every kind trains on the same tokens within a fixed time. --evaluate: the replacements scored
by resid.analyses.training.evaluate_replacements on the held-out side of the corpus (FVU, CE loss recovered, KL,
replacement and completeness scores of --prompts' graphs), printed as a table and, with --results, appended as one
JSON record per kind with its tokens/s and share of its FLOP bound (gpu_dictionaries.transcoder_flops at this
device's float32 matmul rate). --out is optional then (the trained folders are written only where it is given).
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import gpu_dictionaries
import gpu_models
import torch
from gpu_timing import free_cache, matmul_flops, sync

import resid
from resid.analyses.distributed.execution import Execution
from resid.analyses.distributed.steps import drive_steps
from resid.analyses.io import corpus
from resid.analyses.lenses import data
from resid.analyses.training.crosslayer import TANH_SCALE, CrossLayerJob
from resid.analyses.training.loop import Spec
from resid.analyses.training.recipe import Recipe
from resid.analyses.training.replacements import evaluate_replacements
from resid.analyses.training.trainer import Trainer
from resid.dictionaries import check
from resid.dictionaries.formats import circuit_tracer, saelens

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PROMPTS = ("The Eiffel Tower is located in the city of",
           "When Mary and John went to the store, John gave a drink to")
SHOWN = ("replacement", "kind", "tokens_per_s", "flop_fraction", "fvu", "ce_loss_recovered", "kl_spliced", "l0",
         "dead_fraction", "replacement_score", "completeness_score")


class SideBySide(CrossLayerJob):
    """The CLT's step job, whose every batch also steps one per-layer transcoder (plain or skip) per layer; each
    kind's step time is kept per batch (the device synchronised around it)."""

    def __init__(self, *args, kinds: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        d_in, d_out = self.trainers[0].coder.d_in, self.trainers[0].coder.d_out
        self.kinds = kinds
        self.per_layer = {kind: [Trainer.new(self.recipe, d_in, d_out, transcoder=True, skip=kind == "skip",
                                             device=self.source.device)
                                 for _ in self.pairs] for kind in kinds if kind != "clt"}
        self.times: dict[str, list[float]] = {kind: [] for kind in kinds}

    def _timed(self, kind: str, fn):
        sync(self.source.device)
        start = time.perf_counter()
        out = fn()
        sync(self.source.device)
        self.times[kind].append(time.perf_counter() - start)
        return out

    def train_on(self, batch):
        for kind, trainers in self.per_layer.items():
            self._timed(kind, lambda trainers=trainers: [trainer.step(batch[p_in], batch[p_out]) for trainer,
                                                         (p_in, p_out) in zip(trainers, self.pairs, strict=True)])
        if "clt" not in self.kinds:
            return []
        return self._timed("clt", lambda: super(SideBySide, self).train_on(batch))

    def dictionaries(self, kind: str) -> list:
        found = []
        for trainer, (p_in, p_out) in zip(self.per_layer[kind], self.pairs, strict=True):
            trainer.check_finite()
            found.append(check(trainer.coder.dictionary(p_in.name, p_out.name, name=f"{p_in.name}-to-{p_out.name}",
                                                        model_name=self.model.name), self.model))
        return found


def recipe_for(tokens: int, batch_size: int, expansion: int, d_sae: int | None, k: int, dead_tokens: int | None
               ) -> Recipe:
    return Recipe.for_budget(tokens, batch_size, transcoder=True, activation="batchtopk", expansion=expansion,
                             d_sae=d_sae, k=k, dead_tokens=dead_tokens)


def side_by_side(model, texts: list[str], kinds: list[str], recipe: Recipe, window: int, forward_batch: int,
                 buffer_tokens: int, progress: bool = False) -> tuple[SideBySide, object, float]:
    """Every kind trained on the same batches: the job (its trainers and step times), the CLT (None without it)
    and the wall time."""
    specs = [Spec.transcoder(model, layer) for layer in range(model.config.n_layers)]
    job = SideBySide(model, texts, specs, recipe, window, forward_batch, buffer_tokens, False, None, False, 10.0,
                     TANH_SCALE, None, kinds=kinds)
    started = time.perf_counter()
    clt = drive_steps(model, job, Execution(progress=progress, checkpoint_every=recipe.steps + 1))
    return job, clt if "clt" in kinds else None, time.perf_counter() - started


def budget_for(model, texts: list[str], kinds: list[str], seconds: float, batch_size: int, settings: dict,
               window: int, forward_batch: int, buffer_tokens: int, probe_steps: int = 4) -> tuple[int, dict]:
    """The tokens (whole batches, at least 8) that a side-by-side run trains on in about `seconds`, from a probe of
    `probe_steps` steps: per step each kind's median step time (the first step, which initialises, left out) and
    the shared forward passes' share of the rest; returns them too ("forward": that share)."""
    recipe = recipe_for(probe_steps * batch_size, batch_size, **settings)
    job, _, wall = side_by_side(model, texts, kinds, recipe, window, forward_batch, buffer_tokens)
    per_step = {kind: statistics.median(t[1:] or t) for kind, t in job.times.items()}
    per_step["forward"] = max(0.0, wall - sum(sum(t) for t in job.times.values())) / probe_steps
    del job
    free_cache(model.device)
    return max(8, int(seconds / sum(per_step.values()))) * batch_size, per_step


def load_model(name: str, weights: str, device: torch.device, dtype: torch.dtype) -> tuple[resid.Transformer, str]:
    """The model and which weights it has: gguf, random, or auto (the GGUF where its package is installed)."""
    if weights == "auto":
        weights = "gguf" if gpu_models.has_gguf(name) else "random"
    return gpu_models.load(name, weights, device, dtype), weights


def compare(model, name: str, weights: str, kinds: list[str], tokens: int, batch_size: int, settings: dict, window: int,
            forward_batch: int, buffer_tokens: int, evaluate: bool = True, prompts: tuple[str, ...] = PROMPTS,
            eval_windows: int = 32, eval_window: int = 128, max_feature_nodes: int | None = 1024,
            progress: bool = False, out: Path | None = None, split: tuple[list[str], list[str]] | None = None
            ) -> list[dict]:
    """Every kind trained on `tokens` of the same batches (written under `out` if given) and, with `evaluate`,
    scored by evaluate_replacements: one record per kind (module docstring), the model called `name` there.
    split: the training and held-out documents (default: the demo corpus's, a tenth held out)."""
    recipe = recipe_for(tokens, batch_size, **settings)
    texts, held_out = split if split is not None else data.split(corpus.demo(), 0.1)
    job, clt, wall = side_by_side(model, texts, kinds, recipe, window, forward_batch, buffer_tokens, progress)
    budget = recipe.steps * batch_size
    replacements = {kind: job.dictionaries(kind) for kind in job.per_layer}
    if clt is not None:
        replacements["clt"] = clt
    if out is not None:
        for kind, found in replacements.items():
            if kind == "clt":
                circuit_tracer.write(found, out / "clt" / "clt")
            else:
                for d in found:
                    saelens.write(d, out / kind / d.name)
    config, rate = model.config, matmul_flops(model.device)
    d_in, d_out = job.trainers[0].coder.d_in, job.trainers[0].coder.d_out
    rows = {kind: {} for kind in kinds}
    if evaluate:
        scores = evaluate_replacements(model, replacements, held_out, prompts=prompts, max_windows=eval_windows,
                                       window=eval_window, max_feature_nodes=max_feature_nodes,
                                       execution=Execution(batch_size=forward_batch, progress=False))
        rows = {row["replacement"]: row for row in scores.table.to_dict("records")}
    records = []
    for kind in kinds:
        seconds = sum(job.times[kind])
        flops = recipe.steps * gpu_dictionaries.transcoder_flops(kind, batch_size, config.n_layers, d_in, d_out,
                                                                 recipe.width(d_in), recipe.k)
        records.append(dict(
            workload="transcoder comparison", model=name,
            dtype=next(name for name, dtype in DTYPES.items() if dtype == model.dtype),
            weights=weights, device=str(model.device), replacement=kind, tokens=budget, steps=recipe.steps,
            batch=batch_size, features=recipe.width(d_in), k=recipe.k, seconds=seconds,
            tokens_per_s=budget / seconds, flop_fraction=flops / rate / seconds, matmul_tflops=rate / 1e12,
            generation_s=wall - sum(sum(t) for t in job.times.values()), windows=eval_windows if evaluate else 0,
            window=eval_window, prompts=len(prompts) if evaluate else 0, eval_tokens=rows[kind].get("tokens"),
            **{key: value for key, value in rows[kind].items() if key not in ("replacement", "tokens", "features",
                                                                               "layers")}))
    return records


def table(records: list[dict]) -> str:
    def fmt(value):
        return f"{value:,.4g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(SHOWN) + " |", "|" + " --- |" * len(SHOWN)]
    return "\n".join(lines + ["| " + " | ".join(fmt(r.get(key, "-")) for key in SHOWN) + " |" for r in records])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", default=None, help="where the trained dictionaries are written (default: nowhere)")
    parser.add_argument("--kinds", default="per-layer,skip,clt")
    parser.add_argument("--tokens", type=int, default=262144)
    parser.add_argument("--seconds", type=float, default=None, help="instead of --tokens: as many tokens as the "
                        "side-by-side run trains on in this time (probed)")
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--expansion", type=int, default=2)
    parser.add_argument("--d-sae", type=int, default=None, help="features per layer (default: expansion x d_in)")
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--forward-batch", type=int, default=8)
    parser.add_argument("--buffer-tokens", type=int, default=20000)
    parser.add_argument("--dead-tokens", type=int, default=None, help="default: the CLI's, a tenth of --tokens; the "
                        "per-layer kinds' AuxK works on features dead that long (the CLT has no AuxK)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp32", help="the model's (the trainers: float32)")
    parser.add_argument("--weights", choices=["gguf", "random", "auto"], default="gguf")
    parser.add_argument("--evaluate", action="store_true", help="score the replacements (evaluate_replacements)")
    parser.add_argument("--eval-windows", type=int, default=32)
    parser.add_argument("--eval-window", type=int, default=128)
    parser.add_argument("--prompts", default="|".join(PROMPTS), help="the graphs' prompts, separated by |")
    parser.add_argument("--max-feature-nodes", type=int, default=1024)
    parser.add_argument("--results", type=Path, default=None, help="a JSON-lines file the records are appended to")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    if set(kinds) - {"per-layer", "skip", "clt"}:
        raise SystemExit(f"unknown --kinds {args.kinds!r}: choose from per-layer, skip, clt")
    model, weights = load_model(args.model, args.weights, torch.device(args.device), DTYPES[args.dtype])
    settings = dict(expansion=args.expansion, d_sae=args.d_sae, k=args.k, dead_tokens=args.dead_tokens)
    stream = dict(window=args.window, forward_batch=args.forward_batch, buffer_tokens=args.buffer_tokens)
    tokens, split = args.tokens, data.split(corpus.demo(), 0.1)
    if args.seconds is not None:
        tokens, per_step = budget_for(model, split[0], kinds, args.seconds, args.batch_size, settings, **stream)
        print(f"probe: seconds per step {', '.join(f'{k} {v:.3f}' for k, v in per_step.items())}: {tokens:,} "
              f"tokens fit {args.seconds:g} s", flush=True)
    records = compare(model, args.model, weights, kinds, tokens, args.batch_size, settings, evaluate=args.evaluate,
                      prompts=tuple(p for p in args.prompts.split("|") if p), eval_windows=args.eval_windows,
                      eval_window=args.eval_window, max_feature_nodes=args.max_feature_nodes, progress=True,
                      out=Path(args.out) if args.out else None, split=split, **stream)
    first = records[0]
    print(f"{args.model} ({weights} weights, {args.dtype}, {args.device}): {first['tokens']:,} tokens each; shared "
          f"forward passes {first['generation_s']:.1f} s; training steps per kind:")
    for r in records:
        print(f"  {r['replacement']:<10} {r['seconds']:8.1f} s   {r['tokens_per_s']:9,.0f} tokens/s   "
              f"{r['flop_fraction']:6.1%} of the FLOP bound")
    if args.evaluate:
        print(table(records))
    if args.results is not None:
        with args.results.open("a") as handle:
            for r in records:
                handle.write(json.dumps(r) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
