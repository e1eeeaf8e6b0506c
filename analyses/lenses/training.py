"""Training a tuned lens (Belrose et al. 2023): one affine translator per site, fitted so that the lens's
distribution at each site matches the model's final one, KL(final || lens), over a corpus.

    lens = train(model, corpus.demo(), Recipe(steps=60, tokens_per_step=4096, seq_len=512), Execution(out="lens/"))

The recipe is tuned-lens 0.2.0's `tuned-lens train` (scripts/train_loop.py and scripts/ingredients.py, read for
this; the defaults of Recipe are its defaults):
- translators: weight and bias start at zero (the logit lens); translator s reads only site s, and its loss is
  the KL at that site alone, the mean over the step's tokens; the final residual has none (tuned-lens's
  num_hidden_layers translators, one per layer input, are every="layer" here).
- loss: KL(final || lens) against the model's distribution at the same token (tuned-lens's default `--loss kl`,
  token_shift 0), in nats.
- optimizer: torch.optim.SGD with Nesterov momentum 0.9, lr = lr_scale * (1 - momentum) = 0.1 (PyTorch's momentum
  multiplies the steady-state step by 1 / (1 - momentum); tuned-lens divides it back out so that lr_scale 1 is its
  tuned value), weight decay 1e-3, and before every step the gradients of all translators clipped together to a
  global L2 norm of 1.0.
- schedule: no warm-up (tuned-lens warms up only Adam, which is not used here), then the learning rate decays
  linearly to zero over the steps (transformers' get_linear_schedule_with_warmup: step t of n uses (n - t) / n).
  With warmup_steps > 0 the decay runs over the remaining steps (tuned-lens passes n - warmup as the total, which
  leaves the last warmup_steps at a learning rate of zero).
- budget: 250 steps of 2^18 tokens (65.5M tokens) in windows of 2048, documents joined by end-of-text tokens
  (resid.analyses.lenses.data.pack), windows in a seeded random order.
- precision: tuned-lens runs each site's forward and loss under bfloat16 autocast. Here precision="bfloat16"
  autocasts only the head (the unembedding's matmul, where the FLOPs are); the translator, the final norm and the
  loss stay float32. precision="float32" runs it all in float32. The default, "auto", is bfloat16 where the device
  multiplies bfloat16 matrices at least as fast as float32 ones (a GPU that supports it; a CPU with bfloat16
  instructions, measured once per process) and float32 elsewhere: on a CPU without them a bfloat16 matmul is
  emulated, several times slower (a toy budget took 43 minutes in bfloat16 against 388 s in float32). The job
  records the precision it chose.
How it is computed differs, not what: the model runs once per batch without gradients; every site's translator and
final norm run as one batched graph per chunk of tokens; the head and the KL run site by site, each backward only
to the norm's output; then one backward through the norms and translators. The gradient of the KL comes from
resid.analyses.lenses.kl in one pass (the same gradient as autograd through log_softmax); for a plain linear
unembedding (no head, no soft cap: most models) the head's forward and backward matmuls are written out there too
(kl_and_input_grad, no autograd), in buffers shared by the sites.

The run is a step job of the step driver (resid.analyses.distributed.steps.drive_steps): its chunks are the forward
batches (Execution.batch_size windows each, in the order the steps take them: the data order is a function of the
step), made in process or on Ray workers (ForwardJob: the model's logits and the residual at every site, sent back
whole, so only worth it where the model's forward outweighs that transfer), and every chunk's gradient is added
in this process, where the translators live. With `execution.out` it writes a checkpoint (resid.analyses.io.
checkpoints, format "resid.tuned_lens.checkpoint": the translators, SGD's momentum buffers, and in its metadata the
steps done and the losses so far) every `execution.checkpoint_every` steps and at the end; rerunning with the same
arguments resumes from it with the same data order, to the run never stopped. The bar shows tokens/s and the step's KL.

Nothing non-finite is trained on or kept: each step checks its losses and gradients before SGD touches the
translators (one sum per tensor, one synchronisation), a checkpoint and the answer check the translators and
momentum buffers, and a checkpoint that does not fit the run (a missing tensor, another shape, a step that is not a
count, losses that are not numbers) is refused by name (resid.analyses.io.checkpoints).
"""

import functools
import hashlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

import torch
from jaxtyping import Int
from torch import Tensor

from resid.analyses.distributed.execution import Execution, as_execution
from resid.analyses.distributed.executor import Job
from resid.analyses.distributed.steps import StepJob, drive_steps, older_arguments
from resid.analyses.io.checkpoints import DamagedState, count, expect
from resid.analyses.lenses import data
from resid.analyses.lenses.formats import unembed_hash
from resid.analyses.lenses.kl import Scratch, final_distribution, kl_and_input_grad, kl_from_final
from resid.analyses.lenses.lens import TunedLens, site_list
from resid.analyses.lenses.translators import Translators
from resid.capture import Capture
from resid.config import finite_number
from resid.errors import ResidError, param
from resid.finite import all_finite
from resid.model import Transformer
from resid.stream import EVERY

CHUNK_ELEMENTS = 2**24  # tokens per readout call: at most this many logits ([chunk d_vocab] float32 is 64 MiB)
FORWARD_TOKENS = 2048  # default tokens per forward pass of the model (batch_size windows of seq_len)
# the gradients are clipped to norm `clip` (1.0) and SGD's momentum multiplies a step by about 1 / (1 - momentum),
# so lr_scale 1 moves the translators by up to ~1 per step; a thousand times that only overflows them
MAX_LR_SCALE = 1000.0


@dataclass(frozen=True)
class Recipe:
    """How a tuned lens is trained; the defaults are tuned-lens's (see the module docstring)."""

    steps: int = 250
    tokens_per_step: int = 2**18  # a multiple of seq_len
    seq_len: int = 2048  # tokens per window
    lr_scale: float = 1.0  # the learning rate is lr_scale * (1 - momentum)
    momentum: float = 0.9  # Nesterov
    weight_decay: float = 1e-3
    warmup_steps: int = 0
    clip: float = 1.0  # global L2 norm of the gradients of all translators
    precision: Literal["auto", "bfloat16", "float32"] = "auto"  # of the head's matmul (see the module docstring)
    every: Literal["layer", "sublayer"] = "layer"  # translators at every layer input, or also at every resid_mid
    seed: int = 42  # of the data order
    bias: bool = True  # translators with a bias

    def __post_init__(self) -> None:
        problems = [f"{param(name, getattr(self, name))} must be positive"
                    for name in ("steps", "tokens_per_step", "seq_len") if getattr(self, name) < 1]
        if self.tokens_per_step % self.seq_len:
            problems.append(f"{param('tokens_per_step', self.tokens_per_step)} must be a multiple of "
                            f"{param('seq_len', self.seq_len)}")
        if self.precision not in ("auto", "bfloat16", "float32"):
            problems.append(f"{param('precision', self.precision)} must be 'auto', 'bfloat16' or 'float32'")
        if self.every not in EVERY:
            problems.append(f"{param('every', self.every)} must be one of {EVERY}")
        if not 0 <= self.warmup_steps < self.steps:
            problems.append(f"warmup_steps={self.warmup_steps} must be in 0..steps-1")
        for name, need, ok in (
                ("lr_scale", f"positive and at most {MAX_LR_SCALE:g} (the learning rate is lr_scale x 0.1 with the "
                 "gradient clipped to norm 1; larger steps only overflow the translators)",
                 lambda v: 0 < v <= MAX_LR_SCALE),
                ("momentum", "in [0, 1)", lambda v: 0 <= v < 1),
                ("weight_decay", "zero or more", lambda v: v >= 0),
                ("clip", "positive", lambda v: v > 0)):
            value = getattr(self, name)
            if not finite_number(value):
                problems.append(f"{param(name, value)} must be a finite number, {need}")
            elif not ok(value):
                problems.append(f"{param(name, value)} must be {need}")
        if problems:
            raise ResidError("Invalid Recipe: " + "; ".join(problems) + ".")

    @property
    def windows_per_step(self) -> int:
        return self.tokens_per_step // self.seq_len

    def lr(self, step: int) -> float:
        """The learning rate of step `step` (0-based): linear warm-up, then linear decay to zero."""
        base = self.lr_scale * (1 - self.momentum)
        if step < self.warmup_steps:
            return base * step / self.warmup_steps
        return base * max(0.0, (self.steps - step) / (self.steps - self.warmup_steps))


def train(
    model: Transformer,
    texts: Sequence[str] | Int[Tensor, "window seq_len"],
    recipe: Recipe = Recipe(),
    execution: Execution | None = None,
    checkpoint_every: int | None = None,
    start: Translators | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> TunedLens:
    """A tuned lens of `model` trained on `texts` (documents, packed into windows of recipe.seq_len), or on ready
    windows of token ids. execution: how the job runs (resid.analyses.Execution): `out` the checkpoint's folder (a
    checkpoint there of the same run is resumed), `batch_size` windows per forward pass ("auto": FORWARD_TOKENS
    tokens' worth), `executor` / `workers` where the forward passes run, `progress` the bar. start: translators to
    fine-tune (default: zeros, the logit lens). on_step(step, mean KL) is called after each step.
    execution.checkpoint_every: steps between checkpoints (the argument checkpoint_every of before is taken for one
    release, with a DeprecationWarning); a lens trains where the model runs, so it takes no execution.device."""
    execution = older_arguments(as_execution(execution), "tuned_lens.train", checkpoint_every=checkpoint_every)
    if execution.device is not None:
        raise ResidError(f"A tuned lens trains where the model runs ({model.device}): drop Execution(device="
                         f"{execution.device!r}), or move the model there.")
    job = LensJob(model, texts, recipe, execution.batch_size, start, on_step)
    return drive_steps(model, job, execution)


@dataclass
class ForwardJob(Job):
    """What one chunk of a lens's training computes, as plain data: the chunk is a forward batch of windows
    [window seq] of token ids, its result the model's logits [token d_vocab] and the residual at every site the
    translators read [site token d_model], without gradients."""

    every: str

    name = "tuned lens forward"

    def setup(self, model: Transformer) -> Transformer:
        return model

    def run(self, model: Transformer, ids: Tensor) -> Iterator[tuple[Tensor, Tensor]]:
        run = model.run(ids.to(model.device), capture=Capture(final_norm_scale=False))
        final = run.logits.flatten(0, 1)
        inputs = torch.stack([resid.flatten(0, 1) for _, resid in run.stream.running(self.every)][:-1])
        yield final, inputs

    def combine(self, pieces: list) -> tuple[Tensor, Tensor]:
        return pieces[0]


class LensJob(StepJob):
    """A tuned lens's training as a step job (see the module docstring): the translators of every site stacked in
    two leaves, and their SGD optimizer."""

    name = "tuned lens"
    unit = "tok"
    kind = "resid.tuned_lens.checkpoint"
    what = "tuned-lens"

    def __init__(self, model: Transformer, texts: Sequence[str] | Tensor, recipe: Recipe, batch_size: int | str,
                 start: Translators | None, on_step: Callable[[int, float], None] | None):
        if not isinstance(model, Transformer):
            raise ResidError(f"A tuned lens is trained on a decoder-only resid.Transformer, got "
                             f"{type(model).__name__}.")
        if recipe.precision == "auto":
            recipe = replace(recipe, precision=fast_precision(model.device))
        self.model, self.recipe, self.on_step = model, recipe, on_step
        self.sites = tuple(site_list(model, recipe.every)[:-1])
        initial = start if start is not None else Translators.zeros(self.sites, model.config.d_model, recipe.every,
                                                                    recipe.bias)
        TunedLens(model, initial)  # checks the model (decoder, token logits) and the translators' sites
        if initial.sites != self.sites or (initial.bias is not None) != recipe.bias:
            raise ResidError(f"start= has translators at {[s.label for s in initial.sites]} (bias: "
                             f"{initial.bias is not None}); the recipe trains {[s.label for s in self.sites]} (bias: "
                             f"{recipe.bias}). Use a start lens of the same {param('every')} and bias.")
        windows = texts if isinstance(texts, Tensor) else data.pack(model, texts, recipe.seq_len)
        if windows.ndim != 2 or windows.shape[1] != recipe.seq_len:
            raise ResidError(f"Windows must be [window seq_len={recipe.seq_len}] token ids, got "
                             f"{list(windows.shape)}.")
        needed = recipe.steps * recipe.windows_per_step
        if len(windows) < needed:
            raise ResidError(
                f"{recipe.steps} steps of {recipe.windows_per_step} windows need {needed} windows of "
                f"{recipe.seq_len} tokens; the corpus gives {len(windows)}: give more text, or fewer steps or tokens "
                "per step."
            )
        self.windows, self.order = windows, data.window_order(len(windows), recipe.seed)[:needed]
        self.batch_size = max(1, FORWARD_TOKENS // recipe.seq_len) if batch_size == "auto" else batch_size
        self._settings = {"model": model.name, "unembed_hash": unembed_hash(model),
                          "sites": [s.label for s in self.sites], "recipe": asdict(recipe),
                          "data": data.packed_fingerprint(windows), "start": None if start is None else _digest(start)}
        self.steps, self.step_size = recipe.steps, recipe.tokens_per_step
        self._load(0, initial.weight, initial.bias, None, None, [])

    def _load(self, step: int, weight: Tensor, bias: Tensor | None, momentum_weight: Tensor | None,
              momentum_bias: Tensor | None, losses: list[float]) -> None:
        # Two leaves, all sites stacked: SGD, weight decay and clipping are elementwise or global, so this is the
        # same optimizer as one per translator, with two tensors for the small ops instead of 2 x sites.
        device = self.model.device
        self.step, self.losses = step, losses
        self.weight = weight.detach().to(device, torch.float32).clone().requires_grad_()
        self.bias = None if bias is None else bias.detach().to(device, torch.float32).clone().requires_grad_()
        self.leaves = [self.weight] if self.bias is None else [self.weight, self.bias]
        self.optimizer = torch.optim.SGD(self.leaves, lr=self.recipe.lr(0), momentum=self.recipe.momentum,
                                         nesterov=True, weight_decay=self.recipe.weight_decay)
        for leaf, buffer in zip(self.leaves, (momentum_weight, momentum_bias)):
            if buffer is not None:
                self.optimizer.state[leaf]["momentum_buffer"] = buffer.to(leaf.device).clone()
        self._forwards = 0  # forward batches of the current step added in

    def settings(self) -> dict:
        return self._settings

    def restore(self, tensors: dict[str, Tensor], metadata: dict[str, str]) -> None:
        step = count(metadata, "step", self.steps)
        leaves = {"weight": self.weight, **({"bias": self.bias} if self.bias is not None else {})}
        if step > 0:  # SGD's momentum buffers exist from the first step on
            leaves.update({f"momentum_{name}": leaf for name, leaf in list(leaves.items())})
        found = {name: expect(tensors, name, leaf.detach().cpu()) for name, leaf in leaves.items()}
        extra = sorted(set(tensors) - set(found))
        if extra:
            raise DamagedState(f"it has tensors this lens does not ({', '.join(extra[:4])})")
        try:
            losses = json.loads(metadata.get("losses", ""))
        except ValueError:
            raise DamagedState("its metadata's 'losses' are not JSON") from None
        if not (isinstance(losses, list) and len(losses) == step and all(finite_number(x) for x in losses)):
            raise DamagedState(f"its metadata's 'losses' are not the {step} finite numbers of its {step} steps")
        self._load(step, found["weight"], found.get("bias"), found.get("momentum_weight"),
                   found.get("momentum_bias"), losses)

    def _non_finite(self, gradients: bool = False) -> str | None:
        """The first translator weight, bias or momentum buffer (or gradient) holding a NaN or an infinity, named
        with its site; None if none."""
        parts = [("weight", self.weight), ("bias", self.bias)]
        for leaf_name, leaf in list(parts):
            buffer = None if leaf is None else self.optimizer.state.get(leaf, {}).get("momentum_buffer")
            parts.append((f"SGD's momentum of the {leaf_name}", buffer))
            if gradients:
                parts.append((f"the gradient of the {leaf_name}", None if leaf is None else leaf.grad))
        for name, tensor in parts:
            if tensor is None:
                continue
            bad = ~tensor.detach().isfinite().flatten(1).all(1)  # [site]
            if bool(bad.any()):
                return f"{name} of the translator at {self.sites[int(bad.nonzero()[0])].label}"
        return None

    def _error(self, culprit: str) -> ResidError:
        return ResidError(
            f"Tuned-lens training stopped in step {self.step + 1} of {self.steps}: {culprit} is not finite (NaN or "
            "infinite), so the lens would be NaN; nothing of this step was kept, and a checkpoint holds the last "
            f"good state. Lower the learning rate ({param('lr_scale', self.recipe.lr_scale)}; try 10x lower) and "
            "start over (a checkpoint of other settings is not resumed: delete it or choose another folder)."
        )

    def state(self) -> tuple[dict[str, Tensor], dict[str, str]]:
        culprit = self._non_finite()
        if culprit is not None:  # never checkpointed: the last good checkpoint stays
            raise self._error(culprit)
        def momentum(leaf: Tensor | None) -> Tensor | None:
            buffer = None if leaf is None else self.optimizer.state.get(leaf, {}).get("momentum_buffer")
            return None if buffer is None else buffer.detach()

        parts = {"weight": self.weight, "bias": self.bias, "momentum_weight": momentum(self.weight),
                 "momentum_bias": momentum(self.bias)}
        tensors = {name: t.detach().float().cpu() for name, t in parts.items() if t is not None}
        return tensors, {"step": str(self.step), "losses": json.dumps(self.losses)}

    def feed(self, remote: bool) -> ForwardJob:
        return ForwardJob(self.recipe.every)

    def chunks(self) -> Iterator[Tensor]:
        per_step = self.recipe.windows_per_step
        for step in range(self.step, self.steps):
            ids = self.windows[self.order[step * per_step:(step + 1) * per_step]]
            for first in range(0, len(ids), self.batch_size):
                yield ids[first:first + self.batch_size]

    def consume(self, result: tuple[Tensor, Tensor]) -> Iterator[dict[str, str]]:
        recipe, device = self.recipe, self.model.device
        if self._forwards == 0:  # a step begins: the head cast once, the losses from zero
            self._head, self._scratch = _plain_head(self.model, recipe.precision == "bfloat16"), Scratch()
            self._step_losses = torch.zeros(len(self.weight), device=device)
        final, inputs = (t.to(device) for t in result)  # made on a worker: here
        _backward(self.model, self.weight, self.bias, final, inputs, recipe.tokens_per_step, recipe.precision,
                  self._head, self._scratch, self._step_losses)
        self._forwards += 1
        if self._forwards < -(-recipe.windows_per_step // self.batch_size):
            return
        # before SGD, so the translators stay the last step's; one cheap pass per tensor usually (resid.finite)
        if not all_finite(self._step_losses, *(leaf.grad for leaf in self.leaves)):
            bad = (~self._step_losses.isfinite()).nonzero()
            loss = f"the KL at {self.sites[int(bad[0])].label}" if len(bad) else None
            raise self._error(self._non_finite(gradients=True) or loss or "a gradient")
        torch.nn.utils.clip_grad_norm_(self.leaves, recipe.clip)
        for group in self.optimizer.param_groups:
            group["lr"] = recipe.lr(self.step)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.losses.append(float(self._step_losses.mean()))
        self.step, self._forwards = self.step + 1, 0
        yield {"kl": f"{self.losses[-1]:.3f}"}

    def stepped(self) -> None:
        if self.on_step is not None:
            self.on_step(self.step - 1, self.losses[-1])  # the 0-based index of the step just done

    def finish(self, out: Path | None) -> TunedLens:
        culprit = self._non_finite()
        if culprit is not None:
            raise self._error(culprit)
        weight = self.weight.detach().cpu()
        bias = None if self.bias is None else self.bias.detach().cpu()
        info = {"model": self.model.name, "unembed_hash": self._settings["unembed_hash"],
                "recipe": asdict(self.recipe), "tokens": self.step * self.recipe.tokens_per_step,
                "losses": list(self.losses), "windows": len(self.windows), "data": self._settings["data"]}
        return TunedLens(self.model, Translators(self.sites, weight, bias, self.recipe.every, info))


@functools.cache
def fast_precision(device: torch.device) -> str:
    """"bfloat16" where `device` multiplies bfloat16 matrices at least as fast as float32 ones, else "float32": a GPU
    by whether it supports bfloat16, a CPU by timing one head-sized matmul in each (best of three, once per process)."""
    if device.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    if device.type != "cpu":
        return "float32"
    times = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(256, 512, dtype=dtype), torch.randn(512, 2048, dtype=dtype)
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - start)
        times[dtype] = best
    return "bfloat16" if times[torch.bfloat16] <= times[torch.float32] else "float32"


def loss_and_gradients(
    model: Transformer, translators: Translators, ids: Int[Tensor, "window seq"], precision: str = "float32",
    batch_size: int | None = None,
) -> tuple[Tensor, Translators]:
    """The loss of one step on the windows `ids` ([site] mean KL per token) and its gradient, as Translators
    (weight and bias hold d loss / d weight, d loss / d bias): what `train` feeds the optimizer, before clipping."""
    lens = TunedLens(model, translators)
    if list(translators.sites) != site_list(model, translators.every)[:-1]:
        raise ResidError("loss_and_gradients takes translators at every site of their `every` but the last.")
    weight = lens.translators.weight.clone().float().requires_grad_()
    bias = None if translators.bias is None else lens.translators.bias.clone().float().requires_grad_()
    recipe = Recipe(steps=1, tokens_per_step=ids.numel(), seq_len=ids.shape[1], precision=precision,
                    every=translators.every, bias=translators.bias is not None)
    losses = _accumulate(model, weight, bias, ids, recipe, batch_size or len(ids))
    return losses, Translators(translators.sites, weight.grad, None if bias is None else bias.grad, translators.every)


def _accumulate(model: Transformer, weight: Tensor, bias: Tensor | None, ids: Tensor, recipe: Recipe,
                batch_size: int) -> Tensor:
    """Adds d loss / d translators to weight.grad and bias.grad (loss: each site's KL, mean over all tokens of
    `ids`) and returns the per-site losses [site]: ForwardJob's forward passes, batch_size windows each, and each
    one's _backward."""
    losses = torch.zeros(len(weight), device=model.device)
    head, scratch = _plain_head(model, recipe.precision == "bfloat16"), Scratch()
    forward = ForwardJob(recipe.every)
    for first in range(0, len(ids), batch_size):
        (final, inputs), = forward.run(model, ids[first:first + batch_size])
        _backward(model, weight, bias, final, inputs, ids.numel(), recipe.precision, head, scratch, losses)
    return losses


def _backward(model: Transformer, weight: Tensor, bias: Tensor | None, final: Tensor, inputs: Tensor,
              n_tokens: int, precision: str, head: tuple[Tensor, Tensor | None] | None, scratch: Scratch,
              losses: Tensor) -> None:
    """One forward batch's part of a step: adds its d loss / d translators to weight.grad and bias.grad (loss:
    each site's KL, mean over the step's `n_tokens` tokens) and its per-site losses to `losses` [site]. Per chunk
    of tokens, every site's translator and final norm at once, the head and KL site by site (each with its own
    backward to the norm's output), and one backward through the norms and translators."""
    readout, device = model.readout, model.device
    bf16 = precision == "bfloat16"
    # Equal chunks of at most CHUNK_ELEMENTS logits each (512 tokens: 2 x 256, not 341 + 171).
    n_chunks = -(-final.shape[0] // max(1, CHUNK_ELEMENTS // model.config.d_vocab))
    size = -(-final.shape[0] // n_chunks)
    for at in range(0, final.shape[0], size):
        p, neg_entropy = final_distribution(final[at:at + size])
        with torch.enable_grad():
            h = inputs[:, at:at + size].float()  # [site token d_model]
            translated = h + (torch.bmm(h, weight.transpose(1, 2)) if bias is None
                              else torch.baddbmm(bias[:, None, :], h, weight.transpose(1, 2)))
            normalized, _ = readout.normalize(translated.to(model.dtype))
        grads = torch.empty_like(normalized)
        if head is not None:  # a plain unembedding: each site's loss and gradient by hand, in shared buffers
            for i in range(len(weight)):
                kl, grad = kl_and_input_grad(normalized[i].detach(), *head, p, neg_entropy, scratch)
                grads[i] = grad / n_tokens
                losses[i] += kl.sum() / n_tokens
        else:  # autocast for the head's matmul only, around the sites so the unembedding is cast once
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                for i in range(len(weight)):
                    with torch.enable_grad():
                        x = normalized[i].detach().requires_grad_()
                        loss = kl_from_final(readout.head_logits(x), p, neg_entropy).sum() / n_tokens
                        (grads[i],) = torch.autograd.grad(loss, x)
                    losses[i] += loss.detach()
        normalized.backward(grads)  # into weight.grad and bias.grad


def _plain_head(model: Transformer, bf16: bool) -> tuple[Tensor, Tensor | None] | None:
    """The unembedding's weight and bias in the head's compute dtype, cast once per step, when the readout after the
    final norm is that linear map alone (no head, no soft cap); else None (autograd through head_logits)."""
    readout = model.readout
    unembed = readout.unembed
    if readout.head is not None or unembed.softcap is not None:
        return None
    dtype = torch.bfloat16 if bf16 else unembed.weight.dtype
    bias = None if unembed.b_U is None else unembed.b_U.detach().to(dtype)
    return unembed.weight.detach().to(dtype), bias


def _digest(translators: Translators) -> str:
    parts = [translators.weight] if translators.bias is None else [translators.weight, translators.bias]
    return hashlib.sha256(b"".join(t.detach().float().cpu().numpy().tobytes() for t in parts)).hexdigest()
