"""Training dictionaries on a model's activations: several at once from one forward pass, resumably.

    saes = train(model, corpus.demo(), ["blocks.15.hook_resid_post"], Recipe(activation="topk", k=32, steps=2000),
                 folder="runs/sae")
    transcoders = train(model, texts, [Spec.transcoder(model, l) for l in range(model.config.n_layers)], recipe)

Each Spec names the hook a dictionary reads and, for a transcoder, the hook it predicts. One Activations stream
(resid.analyses.training.activations) reads every hook of every Spec from the same forward passes, and each step
gives every dictionary the same tokens. With `folder`, a checkpoint (resid.analyses.training.checkpoint) is written
every `checkpoint_every` steps and at the end, and rerunning the same call resumes from it: the stream restarts at
the saved Position and every dictionary's weights, buffers and Adam state are restored, so the run ends with the
weights of a run that was never stopped. At the end each dictionary is written to FOLDER/<name>/ in SAELens's
format (resid.dictionaries.formats.saelens.write). A tqdm bar shows tokens/s and the last step's L0, FVU and dead
fraction, each the mean over the dictionaries.
"""

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from resid.analyses.io import corpus as corpora
from resid.analyses.training import checkpoint
from resid.analyses.training.activations import Activations, Position
from resid.analyses.training.recipe import Recipe
from resid.analyses.training.trainer import Stats, Trainer
from resid.dictionaries import Dictionary, check
from resid.dictionaries.formats import saelens
from resid.errors import ResidError
from resid.model import Transformer


@dataclass(frozen=True)
class Spec:
    """One dictionary to train: an SAE reads and reconstructs hook_in; a transcoder reads hook_in and predicts
    hook_out (with a skip path x @ W_skip if skip)."""

    hook_in: str
    hook_out: str | None = None
    skip: bool = False
    name: str | None = None

    @classmethod
    def transcoder(cls, model: Transformer, layer: int, skip: bool = False) -> "Spec":
        """The MLP of `layer`: its standardized input (TransformerLens's ln2.hook_normalized) to its write
        (hook_mlp_out). In a model without pre-norms the input is hook_mlp_in; in one where a pre-MLP norm's gain
        has a zero entry (Gemma 3 270M: 17 of its 18 layers) it is the norm's output after the gain (mlp.hook_in)
        at every layer, since a splice cannot undo such a gain and attribution graphs splice the transcoders."""
        if not model.config.pre_norms:
            hook_in = f"blocks.{layer}.hook_mlp_in"
        elif any(bool((block.ln_mlp._gain32() == 0).any()) for block in model.blocks if block.ln_mlp is not None):
            hook_in = f"blocks.{layer}.mlp.hook_in"
        else:
            hook_in = f"blocks.{layer}.ln2.hook_normalized"
        return cls(hook_in, f"blocks.{layer}.hook_mlp_out", skip)

    @property
    def label(self) -> str:
        if self.name is not None:
            return self.name
        return self.hook_in if self.hook_out is None else f"{self.hook_in}-to-{self.hook_out}"


def train(
    model: Transformer,
    corpus: corpora.Source,
    specs: Sequence[Spec | str],
    recipe: Recipe = Recipe(),
    folder: str | Path | None = None,
    checkpoint_every: int = 100,
    window: int = 256,
    forward_batch: int = 8,
    buffer_tokens: int = 2**16,
    keep_bos: bool = False,
    device: torch.device | str | None = None,
    autocast: bool = False,
    max_norm_ratio: float | None = 10.0,
    progress: bool = True,
    on_step: Callable[[int, list[Stats]], None] | None = None,
) -> list[Dictionary]:
    """One dictionary per Spec (a hook name is an SAE there), trained on `corpus` (a list of documents or a .txt /
    .jsonl path) as `recipe` says; see the module docstring. autocast: the model's forward under bf16 autocast;
    max_norm_ratio: outlier tokens left out (resid.analyses.training.activations). progress: a bar with the step's L0,
    FVU and dead fraction, means over the dictionaries. on_step(step, stats per dictionary) after each step."""
    specs = [Spec(s) if isinstance(s, str) else s for s in specs]
    if not specs:
        raise ResidError("Give at least one hook or Spec to train a dictionary at.")
    labels = [s.label for s in specs]
    if len(set(labels)) < len(labels):
        raise ResidError(f"Two dictionaries are named alike ({labels}): give each Spec its own name.")
    if not isinstance(checkpoint_every, int) or checkpoint_every < 1:
        raise ResidError(f"checkpoint_every must be a positive number of steps, got {checkpoint_every!r}.")
    if folder is not None and recipe.activation == "topk" and any(s.hook_out is not None for s in specs):
        raise ResidError("SAELens's format, which the trained dictionaries are saved in, has no TopK transcoder: train "
                         "transcoders with activation='batchtopk' (saved as JumpReLU), 'jumprelu' or 'relu'.")
    texts = corpora.load(corpus)
    hooks = [h for s in specs for h in (s.hook_in, s.hook_out) if h is not None]
    source = Activations(model, texts, hooks, recipe.batch_size, window, forward_batch, buffer_tokens, keep_bos,
                         recipe.seed, device, autocast, max_norm_ratio)
    trainers = [Trainer.new(recipe, source.width(s.hook_in), source.width(s.hook_out or s.hook_in),
                            transcoder=s.hook_out is not None, skip=s.skip, device=source.device) for s in specs]
    settings = {"model": model.name, "specs": [asdict(s) for s in specs], "recipe": asdict(recipe),
                "data": _fingerprint(source), "window": window, "forward_batch": forward_batch,
                "buffer_tokens": buffer_tokens, "keep_bos": keep_bos, "autocast": autocast,
                "max_norm_ratio": max_norm_ratio}
    saved = checkpoint.load(folder, settings) if folder is not None else None
    step, position = 0, Position(0, 0)
    if saved is not None:
        step, position = saved.step, saved.position
        for trainer, state in zip(trainers, saved.tensors):
            trainer.restore(state, step)
    bar = tqdm(total=recipe.steps * recipe.batch_size, initial=step * recipe.batch_size, unit="tok", unit_scale=True,
               desc="train", disable=not progress)
    stream = source.batches(position)
    while step < recipe.steps:
        position, batch = next(stream)
        stats = [t.step(batch[s.hook_in], batch[s.hook_out] if s.hook_out else None) for t, s in zip(trainers, specs)]
        step += 1
        if folder is not None and (step % checkpoint_every == 0 or step == recipe.steps):
            checkpoint.save(folder, step, position, [t.state() for t in trainers], settings)
        bar.update(recipe.batch_size)
        mean = lambda field: sum(getattr(x, field) for x in stats) / len(stats)  # noqa: E731 (over dictionaries)
        bar.set_postfix(l0=f"{mean('l0'):.1f}", fvu=f"{mean('fvu'):.3f}", dead=f"{mean('dead'):.2f}")
        if on_step is not None:
            on_step(step, stats)
    bar.close()
    info = {"recipe": asdict(recipe), "tokens": recipe.steps * recipe.batch_size, "data": settings["data"],
            "keep_bos": keep_bos, "autocast": autocast, "max_norm_ratio": max_norm_ratio,
            "trainer": "resid.analyses.training"}
    out = [check(t.coder.dictionary(s.hook_in, s.hook_out, name=s.label, model_name=model.name, metadata=info), model)
           for t, s in zip(trainers, specs)]
    if folder is not None:
        for d in out:
            saelens.write(d, Path(folder) / _folder_name(d.name))
    return [d.to(model.device) for d in out]  # where the model runs them (trained on a GPU: there)


def _fingerprint(source: Activations) -> str:
    """sha256 of the windows' token ids: a checkpoint resumes only on the corpus it was trained on."""
    digest = hashlib.sha256()
    for w in source.windows:
        digest.update(w.ids.tobytes())
        digest.update(b"|")
    return digest.hexdigest()


def _folder_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)
