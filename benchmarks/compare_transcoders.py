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
"""

import argparse
import time
from pathlib import Path

import torch

import resid
from resid.analyses.distributed.execution import Execution
from resid.analyses.distributed.steps import drive_steps
from resid.analyses.io import corpus
from resid.analyses.lenses import data
from resid.analyses.training.crosslayer import TANH_SCALE, CrossLayerJob
from resid.analyses.training.loop import Spec
from resid.analyses.training.recipe import Recipe
from resid.analyses.training.trainer import Trainer
from resid.dictionaries import check
from resid.dictionaries.formats import circuit_tracer, saelens


class SideBySide(CrossLayerJob):
    """The CLT's step job, whose every batch also steps one per-layer transcoder (plain or skip) per layer."""

    def __init__(self, *args, kinds: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        d_in, d_out = self.trainers[0].coder.d_in, self.trainers[0].coder.d_out
        self.kinds = kinds
        self.per_layer = {kind: [Trainer.new(self.recipe, d_in, d_out, transcoder=True, skip=kind == "skip")
                                 for _ in self.pairs] for kind in kinds if kind != "clt"}
        self.seconds = {kind: 0.0 for kind in kinds}

    def train_on(self, batch):
        for kind, trainers in self.per_layer.items():
            start = time.perf_counter()
            for trainer, (p_in, p_out) in zip(trainers, self.pairs, strict=True):
                trainer.step(batch[p_in], batch[p_out])
            self.seconds[kind] += time.perf_counter() - start
        if "clt" not in self.kinds:
            return []
        start = time.perf_counter()
        stats = super().train_on(batch)
        self.seconds["clt"] += time.perf_counter() - start
        return stats

    def dictionaries(self, kind: str) -> list:
        found = []
        for trainer, (p_in, p_out) in zip(self.per_layer[kind], self.pairs, strict=True):
            trainer.check_finite()
            found.append(check(trainer.coder.dictionary(p_in.name, p_out.name, name=f"{p_in.name}-to-{p_out.name}",
                                                        model_name=self.model.name), self.model))
        return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", required=True)
    parser.add_argument("--kinds", default="per-layer,skip,clt")
    parser.add_argument("--tokens", type=int, default=262144)
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--expansion", type=int, default=2)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--forward-batch", type=int, default=8)
    parser.add_argument("--buffer-tokens", type=int, default=20000)
    parser.add_argument("--dead-tokens", type=int, default=None, help="default: the CLI's, a tenth of --tokens; the "
                        "per-layer kinds' AuxK works on features dead that long (the CLT has no AuxK)")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    recipe = Recipe.for_budget(args.tokens, args.batch_size, transcoder=True, activation="batchtopk",
                               expansion=args.expansion, k=args.k, dead_tokens=args.dead_tokens)
    steps = recipe.steps
    model = resid.load(args.model)
    training = data.split(corpus.demo(), 0.1)[0]
    specs = [Spec.transcoder(model, layer) for layer in range(model.config.n_layers)]
    job = SideBySide(model, training, specs, recipe, args.window, args.forward_batch, args.buffer_tokens, False, None,
                     False, 10.0, TANH_SCALE, None, kinds=kinds)
    started = time.perf_counter()
    clt = drive_steps(model, job, Execution(progress=True), checkpoint_every=steps + 1)
    seconds = time.perf_counter() - started
    out = Path(args.out)
    if "clt" in kinds:
        circuit_tracer.write(clt, out / "clt" / "clt")
    for kind in job.per_layer:
        for d in job.dictionaries(kind):
            saelens.write(d, out / kind / d.name)
    budget = steps * args.batch_size
    print(f"{budget:,} tokens in {seconds:.0f} s; training steps per kind (the rest is the shared forward passes):")
    for kind, s in job.seconds.items():
        print(f"  {kind:<10} {s:8.1f} s   {budget / max(s, 1e-9):9,.0f} tokens/s")


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
