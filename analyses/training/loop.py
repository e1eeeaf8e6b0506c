"""Training dictionaries on a model's activations: several at once from one forward pass, resumably, in process or
with the activations made on Ray workers.

    saes = train(model, corpus.demo(), [Site(15, "resid_post")], Recipe(activation="topk", k=32, steps=2000),
                 Execution(out="runs/sae"))
    transcoders = train(model, texts, [Spec.transcoder(model, l) for l in range(model.config.n_layers)], recipe,
                        Execution(executor="ray", workers=2))

Each Spec names the Site a dictionary reads and, for a transcoder, the Site it predicts (a string is read by
Site.parse: a site label, or a TransformerLens hook name). One Activations plan
(resid.analyses.training.activations) reads every Site of every Spec from the same forward passes, and each step
gives every dictionary the same tokens. The run is a step job of the step driver
(resid.analyses.distributed.steps.drive_steps): the blocks of activations are its chunks, made in process or on
Ray workers (one model each) and taken in block order by the trainers in this process, so the weights do not
depend on who made them. With `execution.out`, a checkpoint (resid.analyses.io.checkpoints) is written every
`execution.checkpoint_every` steps and at the end, and rerunning the same call resumes from it: the stream restarts at
the saved Position and every dictionary's weights, buffers and Adam state are restored, so the run ends with the
weights of a run that was never stopped. At the end each dictionary is written to OUT/<name>/ in SAELens's format
(resid.dictionaries.formats.saelens.write), under the TransformerLens hook names SAELens reads (the dictionary's
HookPoint). The progress bar shows tokens/s and the L0, FVU and dead fraction of a recent step (read every
STATS_EVERY steps: a step asks the host for nothing else, see trainer.step_together), each the mean over the
dictionaries.

Checkpoint (OUT/checkpoint.safetensors, format "resid.training.checkpoint"): for dictionary i its parameters and
buffers (`i.coder.W_enc`, ..., `i.coder.since_fired`) and Adam's moments and step counts (`i.adam.W_enc.exp_avg`,
...); metadata: the steps done, the stream's Position (block, batch in block) and the number of dictionaries; the
settings: model, the Specs as Site labels, recipe, corpus fingerprint, pipeline options.
"""

import hashlib
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from resid.analyses.distributed.execution import Execution, as_execution
from resid.analyses.distributed.steps import StepJob, drive_steps, older_arguments
from resid.analyses.io import checkpoints
from resid.analyses.io import corpus as corpora
from resid.analyses.io.checkpoints import DamagedState, count
from resid.analyses.training.activations import Activations, BlockJob, Position, batches
from resid.analyses.training.recipe import Recipe
from resid.analyses.training.trainer import Stats, Trainer, step_together
from resid.batching import available_bytes
from resid.dictionaries import Dictionary, check
from resid.dictionaries.formats import saelens
from resid.dictionaries.hooks import HookPoint, hook_point, point_of, width
from resid.errors import ResidError, param
from resid.model import Transformer
from resid.sites import Site

FORWARD_BATCH = 8  # windows per forward pass when Execution.batch_size is "auto"
# steps between two readings of the statistics the progress bar shows (each waits for the device to finish the step)
STATS_EVERY = 20
# buffer_tokens="auto": a quarter of the free memory (the dictionaries, their Adam state and the model need the rest),
# at least one batch, at most 2^16 tokens (SAELens's and sparsify's buffers are of this order; more shuffles no better)
BUFFER_SHARE, BUFFER_MOST = 0.25, 2**16


@dataclass(frozen=True)
class Spec:
    """One dictionary to train: an SAE reads and reconstructs `site_in`; a transcoder reads `site_in` and predicts
    `site_out` (with a skip path x @ W_skip if skip). `site_in` is a Site, or a HookPoint where the tensor read is
    not the Site's record: a norm's output read before the norm's gain and bias (HookPoint.standardized, as
    TransformerLens's ln2.hook_normalized; resid.dictionaries.hooks.point_of(site, config, standardized=True)).
    Strings are read by Site.parse, but for a TransformerLens name of a standardized tensor
    ("blocks.3.ln2.hook_normalized"), which is its HookPoint. `name` names the dictionary (default: its
    TransformerLens hook, or "<in>-to-<out>")."""

    site_in: Site | HookPoint | str
    site_out: Site | str | None = None
    skip: bool = False
    name: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.site_in, str):
            object.__setattr__(self, "site_in", _read_in(self.site_in))
        elif not isinstance(self.site_in, (Site, HookPoint)):
            raise ResidError(f"Spec site_in must be a resid.Site, a HookPoint or a site label, got {self.site_in!r}.")
        if isinstance(self.site_out, str):
            object.__setattr__(self, "site_out", Site.parse(self.site_out))
        elif self.site_out is not None and not isinstance(self.site_out, Site):
            raise ResidError(f"Spec site_out must be a resid.Site or a site label, got {self.site_out!r}.")

    @property
    def reads(self) -> Site:
        """The Site of the tensor read (a standardized HookPoint's: its norm output's)."""
        return self.site_in.site if isinstance(self.site_in, HookPoint) else self.site_in

    @classmethod
    def transcoder(cls, model: Transformer, layer: int, skip: bool = False) -> "Spec":
        """The MLP of `layer`: its input, standardized (before the pre-MLP norm's gain and bias, TransformerLens's
        ln2.hook_normalized), to its write. In a model without pre-norms the input is the residual the MLP reads; in
        one where a pre-MLP norm's gain has a zero entry (Gemma 3 270M: 17 of its 18 layers) it is the norm's output
        after the gain, at every layer, since a splice cannot undo such a gain and attribution graphs splice the
        transcoders."""
        config = model.config
        if not config.pre_norms:
            return cls(model.blocks[layer].reads("mlp"), Site(layer, "mlp"), skip)
        normalized = Site(layer, "mlp", field="normalized")
        zero_gain = any(not b.ln_mlp.invertible for b in model.blocks if b.ln_mlp is not None)
        site_in = normalized if zero_gain else point_of(normalized, config, standardized=True)
        return cls(site_in, Site(layer, "mlp"), skip)

    def points(self, model: Transformer) -> tuple[HookPoint, HookPoint | None]:
        """The tensors read, as HookPoints of this model (named by their TransformerLens hooks)."""
        standardized = isinstance(self.site_in, HookPoint) and self.site_in.standardized
        point_in = point_of(self.reads, model.config, standardized)
        return point_in, None if self.site_out is None else point_of(self.site_out, model.config)

    @property
    def sites(self) -> str:
        """The labels of the Sites read and written ("<in> -> <out>" for a transcoder): with the recipe's seed, they
        seed the dictionary's initial weights."""
        return self.reads.label if self.site_out is None else f"{self.reads.label} -> {self.site_out.label}"

    def settings(self) -> dict:
        """The Spec as a checkpoint records it: Site labels, and whether the input is read standardized."""
        return {"site_in": self.reads.label, "site_out": None if self.site_out is None else self.site_out.label,
                "standardized": isinstance(self.site_in, HookPoint) and self.site_in.standardized, "skip": self.skip,
                "name": self.name}


def _read_in(text: str) -> Site | HookPoint:
    """A Spec's site_in from a string: the HookPoint of a TransformerLens name of a standardized tensor, else the
    Site the string labels."""
    try:
        point = hook_point(text, None)
    except ResidError:
        point = None
    return point if point is not None and point.standardized else Site.parse(text)


def train(
    model: Transformer,
    corpus: corpora.Source,
    specs: Sequence[Spec | Site | str],
    recipe: Recipe = Recipe(),
    execution: Execution | None = None,
    checkpoint_every: int | None = None,
    window: int = 256,
    buffer_tokens: int | str = "auto",
    keep_bos: bool = False,
    device: torch.device | str | None = None,
    autocast: bool = False,
    max_norm_ratio: float | None = 10.0,
    on_step: Callable[[int, list[Stats]], None] | None = None,
) -> list[Dictionary]:
    """One dictionary per Spec (a Site, or a string Site.parse reads, is an SAE there), trained on `corpus` (a list
    of documents or a .txt / .jsonl path) as `recipe` says; see the module docstring. execution: how the job runs
    (resid.analyses.Execution): `out` the folder of the checkpoint and the SAELens folders, `batch_size` windows per
    forward pass ("auto": FORWARD_BATCH), `executor` / `workers` where the activations are made, `progress` the bar.
    buffer_tokens: training tokens per shuffling buffer ("auto": buffer_size, sized from the free memory, or the
    resumed checkpoint's). execution.checkpoint_every: steps between checkpoints; execution.device: where the
    dictionaries train (default: the model's); the arguments checkpoint_every and device of before are taken for one
    release, with a DeprecationWarning. autocast: the model's forward under bf16 autocast;
    max_norm_ratio: outlier tokens left out (resid.analyses.training.activations). on_step(step, stats per
    dictionary: 0-d tensors on the device) after each step (and its checkpoint)."""
    execution = older_arguments(as_execution(execution), "train", checkpoint_every=checkpoint_every, device=device)
    device = execution.device
    specs = [s if isinstance(s, Spec) else Spec(s) for s in specs]
    if not specs:
        raise ResidError("Give at least one Site or Spec to train a dictionary at.")
    if execution.out is not None and recipe.activation == "topk" and any(s.site_out is not None for s in specs):
        raise ResidError("SAELens's format, which the trained dictionaries are saved in, has no TopK transcoder: train "
                         "transcoders with activation='batchtopk' (saved as JumpReLU), 'jumprelu' or 'relu'.")
    if buffer_tokens == "auto":
        buffer_tokens = buffer_size(model, specs, recipe.batch_size, execution.out, device)
    job = TrainingJob(model, corpora.load(corpus), specs, recipe, window,
                      FORWARD_BATCH if execution.batch_size == "auto" else execution.batch_size, buffer_tokens,
                      keep_bos, device, autocast, max_norm_ratio, on_step)
    return drive_steps(model, job, execution)


def buffer_size(model: Transformer, specs: Sequence[Spec | Site | str], batch_size: int,
                out: str | Path | None = None, device: torch.device | str | None = None) -> int:
    """The shuffling buffer's tokens when none is given: the checkpoint's in `out` when there is one (a resumed run
    must cut its blocks as before), else BUFFER_SHARE of the memory free on the training device over the float32
    width of every tensor read, between one batch and BUFFER_MOST tokens."""
    saved = checkpoints.saved_settings(out) if out is not None else None
    if saved is not None and isinstance(saved.get("buffer_tokens"), int) and saved["buffer_tokens"] > 0:
        return saved["buffer_tokens"]
    specs = [s if isinstance(s, Spec) else Spec(s) for s in specs]
    points = {p for s in specs for p in s.points(model) if p is not None}
    per_token = 4 * sum(width(p, model.config) for p in points)
    free = available_bytes(torch.device(device) if device is not None else model.device)
    if free is None:
        return BUFFER_MOST
    return max(batch_size, min(BUFFER_MOST, int(BUFFER_SHARE * free / per_token)))


class TrainingJob(StepJob):
    """Dictionaries trained side by side on one Activations stream: the chunks are its blocks, each step one batch
    of every point (see the module docstring)."""

    name = "train"
    unit = "tok"
    kind = "resid.training.checkpoint"
    what = "training"

    def __init__(self, model: Transformer, texts: list[str], specs: list[Spec], recipe: Recipe, window: int,
                 forward_batch: int, buffer_tokens: int, keep_bos: bool, device: torch.device | str | None,
                 autocast: bool, max_norm_ratio: float | None, on_step: Callable | None):
        self.model, self.specs, self.recipe, self.on_step = model, specs, recipe, on_step
        self.pairs = [s.points(model) for s in specs]
        self.names = [s.name if s.name is not None else p_in.name if p_out is None else f"{p_in.name}-to-{p_out.name}"
                      for s, (p_in, p_out) in zip(specs, self.pairs)]
        if len(set(self.names)) < len(self.names):
            raise ResidError(f"Two dictionaries are named alike ({self.names}): give each Spec its own name.")
        points = [p for pair in self.pairs for p in pair if p is not None]
        labels = [f"{name} (reading {s.reads.label})" for name, s in zip(self.names, specs)]
        _check_sizes(model, recipe, self.pairs, labels, torch.device(device) if device is not None else model.device)
        self.source = Activations(model, texts, points, recipe.batch_size, window, forward_batch, buffer_tokens,
                                  keep_bos, recipe.seed, device, autocast, max_norm_ratio)
        self.trainers = [Trainer.new(recipe, self.source.width(p_in), self.source.width(p_out or p_in),
                                     transcoder=p_out is not None, skip=s.skip, device=self.source.device,
                                     sites=s.sites)
                         for s, (p_in, p_out) in zip(specs, self.pairs)]
        for trainer, label in zip(self.trainers, labels):
            trainer.label = label
        self._settings = {"model": model.name, "specs": [s.settings() for s in specs], "recipe": asdict(recipe),
                          "data": source_fingerprint(self.source), "window": window, "forward_batch": forward_batch,
                          "buffer_tokens": buffer_tokens, "keep_bos": keep_bos, "autocast": autocast,
                          "max_norm_ratio": max_norm_ratio}
        self.steps, self.step, self.step_size = recipe.steps, 0, recipe.batch_size
        self.position = Position(0, 0)  # where the stream is: after `batch` batches of block `block`
        self.stats: list[Stats] = []
        self.postfix: dict[str, str] = {}  # the statistics the bar shows, as last read

    def settings(self) -> dict:
        return self._settings

    def older_settings(self) -> list[dict]:
        """Before Specs held Sites, a checkpoint recorded them by TransformerLens hook name."""
        specs = [{"hook_in": p_in.name, "hook_out": None if p_out is None else p_out.name, "skip": s.skip,
                  "name": s.name} for s, (p_in, p_out) in zip(self.specs, self.pairs)]
        return [{**self._settings, "specs": specs}]

    def restore(self, tensors: dict[str, Tensor], metadata: dict[str, str]) -> None:
        n = count(metadata, "dictionaries")
        if n != len(self.trainers):
            raise DamagedState(f"it holds {n} dictionaries where the run trains {len(self.trainers)}")
        states: list[dict[str, Tensor]] = [{} for _ in range(n)]
        for name, tensor in tensors.items():
            index, _, rest = name.partition(".")
            if not (index.isascii() and index.isdigit() and int(index) < n):
                raise DamagedState(f"its tensor {name!r} belongs to none of the {n} dictionaries")
            states[int(index)][rest] = tensor
        self.step = count(metadata, "step", self.steps)
        self.position = Position(count(metadata, "block"), count(metadata, "batch"))
        for i, (trainer, state) in enumerate(zip(self.trainers, states)):
            try:
                trainer.restore(state, self.step)
            except DamagedState as error:  # name the tensor as the file does
                raise DamagedState(str(error).replace("'", f"'{i}.", 1)) from None

    def state(self) -> tuple[dict[str, Tensor], dict[str, str]]:
        for trainer in self.trainers:  # a NaN is never checkpointed: the last good checkpoint stays
            trainer.check_finite()
        tensors = {f"{i}.{name}": t for i, trainer in enumerate(self.trainers) for name, t in trainer.state().items()}
        metadata = {"step": str(self.step), "block": str(self.position.block), "batch": str(self.position.batch),
                    "dictionaries": str(len(self.trainers))}
        return tensors, metadata

    def feed(self, remote: bool) -> BlockJob:
        # in process, the buffer's filling has its own bar (minutes on a CPU before the first step)
        return self.source.job(None if remote else self.source.device, progress=self.shows_progress and not remote)

    def chunks(self) -> Iterator:
        return self.source.blocks(self.position.block)

    def consume(self, found: dict[HookPoint, Tensor]) -> Iterator[dict[str, str]]:
        block, skip = self.position.block, self.position.batch
        found = {point: tensor.to(self.source.device) for point, tensor in found.items()}  # made on a worker: here
        for position, batch in batches(found, block, self.recipe.batch_size, skip):
            if self.step >= self.steps:
                return
            self.stats = self.train_on(batch)
            self.step, self.position = self.step + 1, position
            if self.shows_progress and (not self.postfix or self.step % STATS_EVERY == 0 or self.step == self.steps):
                self.postfix = summary(self.stats)
            yield self.postfix  # between readings the bar counts the steps with the last statistics
        self.position = Position(block + 1, 0)

    def train_on(self, batch: dict[HookPoint, Tensor]) -> list[Stats]:
        """One optimizer step of every trainer on its points' rows of `batch`."""
        return step_together(self.trainers, [(batch[p_in], batch[p_out] if p_out is not None else None)
                                             for p_in, p_out in self.pairs])

    def run_info(self, trainer: str) -> dict:
        """What a trained dictionary's metadata records of the run that made it (`trainer`: the module)."""
        recipe = self.recipe
        return {"recipe": asdict(recipe), "tokens": recipe.steps * recipe.batch_size, "data": self._settings["data"],
                "keep_bos": self.source.keep_bos, "autocast": self.source.autocast,
                "max_norm_ratio": self.source.max_norm_ratio, "trainer": trainer}

    def stepped(self) -> None:
        if self.on_step is not None:
            self.on_step(self.step, self.stats)

    def finish(self, out: Path | None) -> list[Dictionary]:
        info = self.run_info("resid.analyses.training")
        found = []
        for trainer in self.trainers:  # never a NaN dictionary, with or without checkpoints
            trainer.check_finite()
        for trainer, (p_in, p_out), name in zip(self.trainers, self.pairs, self.names):
            d = trainer.coder.dictionary(p_in.name, None if p_out is None else p_out.name, name=name,
                                         model_name=self.model.name, metadata=info)
            found.append(check(d, self.model))
        if out is not None:
            for d in found:
                saelens.write(d, Path(out) / _folder_name(d.name))
        return [d.to(self.model.device) for d in found]  # where the model runs them (trained on a GPU: there)


def summary(stats: list[Stats]) -> dict[str, str]:
    """The progress line's L0, FVU and dead fraction, each the mean over the dictionaries: one read of the device."""
    l0, fvu, dead = torch.stack([torch.stack([s.l0, s.fvu, s.dead]) for s in stats]).mean(0).tolist()
    return {"l0": f"{l0:.1f}", "fvu": f"{fvu:.3f}", "dead": f"{dead:.2f}"}


def _check_sizes(model: Transformer, recipe: Recipe, pairs: list, labels: list[str], device: torch.device) -> None:
    """k below every d_sae, and the dictionaries with their gradients, Adam's two moments and a batch's activations
    within the free memory of `device`: refused before anything is allocated, saying what fits."""
    sizes = [(width(p_in, model.config), width(p_out or p_in, model.config)) for p_in, p_out in pairs]
    d_saes = [recipe.check_width(d_in, label) for (d_in, _), label in zip(sizes, labels)]
    # per feature: its encoder column, decoder row and bias, 4 copies (weights, gradients, 2 moments) of 4 bytes, and
    # its activations in a batch (pre-activations, activations, their gradient), 4 bytes each
    per_feature = [16 * (d_in + d_out + 1) + 12 * recipe.batch_size for d_in, d_out in sizes]
    need = sum(f * d for f, d in zip(per_feature, d_saes))
    free = available_bytes(device)
    if free is not None and need > 0.8 * free:
        fit = int(0.8 * free / sum(per_feature))
        given = param("d_sae", recipe.d_sae) if recipe.d_sae is not None else param("expansion", recipe.expansion)
        raise ResidError(
            f"{len(d_saes)} dictionar{'y' if len(d_saes) == 1 else 'ies'} of {max(d_saes):,} features ({given}) "
            f"need{'s' if len(d_saes) == 1 else ''} {need / 2**30:,.1f} GiB for their weights, gradients, Adam's "
            f"moments and a batch's activations, more than the {free / 2**30:.1f} GiB free on {device}: at most "
            f"{fit:,} features per dictionary fit "
            "here; lower the width, the batch, or train fewer dictionaries per run.")


def source_fingerprint(source: Activations) -> str:
    """sha256 of the windows' token ids: a checkpoint resumes only on the corpus it was trained on."""
    digest = hashlib.sha256()
    for w in source.windows:
        digest.update(w.ids.tobytes())
        digest.update(b"|")
    return digest.hexdigest()


def _folder_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)
