"""One dictionary's optimizer step: the recipe's loss, its gradient, Adam, the schedule, the decoder's norm.

    trainer = Trainer.new(Recipe(activation="topk", k=32), d_in=576)
    for x in batches:                     # [token d_in] float32 (a transcoder: trainer.step(x, y))
        stats = trainer.step(x)           # loss, l0, fvu, dead fraction of this step (0-d tensors, on the device)

`fit(trainer, batches)` runs the steps from a tensor of activations (synthetic data, tests). The model's
activations are fed by resid.analyses.training.loop, which trains several dictionaries from one forward pass and
steps them together (`step_together`): a step asks the host for two values however many dictionaries it trains
(whether a feature may be dead, for the AuxK recipes; whether everything is finite), never for statistics.

Nothing non-finite is ever trained on or kept: every step checks its loss and gradients (one sum per tensor and one
synchronisation for all the dictionaries, before Adam touches any weight) and `check_finite` checks the whole state
(weights, buffers, Adam's moments) when it is checkpointed or exported. The first non-finite value stops training with a
ResidError naming the step, the dictionary (`label`) and the tensor, and the weights stay those of the step before.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from resid.analyses.io.checkpoints import DamagedState, expect
from resid.analyses.training.batchtopk import BatchTopKCoder
from resid.analyses.training.coder import Coder
from resid.analyses.training.jumprelu import JumpReLUCoder
from resid.analyses.training.recipe import Recipe
from resid.analyses.training.relu import ReLUCoder
from resid.analyses.training.topk import TopKCoder
from resid.errors import ResidError, param
from resid.finite import all_finite, first_non_finite

CODERS = {"relu": ReLUCoder, "topk": TopKCoder, "batchtopk": BatchTopKCoder, "jumprelu": JumpReLUCoder}
BETAS = (0.9, 0.999)  # Adam's, in every library followed


@dataclass(frozen=True)
class Stats:
    """A step's statistics, each a 0-d float32 tensor on the training device: reading one (float(stats.fvu)) waits
    for the step, so the training loop reads them once per logging interval, not every step."""

    loss: Tensor
    l0: Tensor  # mean active features per token
    fvu: Tensor  # fraction of variance unexplained, over the batch
    dead: Tensor  # fraction of features dead (recipe.dead_tokens without firing)


@dataclass(frozen=True)
class _Computed:
    """A step's loss and statistics with its gradients in the weights' .grad, not yet taken by the optimizer."""

    loss: Tensor
    l0: Tensor
    fvu: Tensor
    fired: Tensor  # [feature] (CLT: [layer feature]): the features that fired in the batch
    rows: int  # its tokens


class Trainer:
    """A Coder with its Adam optimizer and the number of steps done."""

    def __init__(self, coder: Coder, device: torch.device | str = "cpu"):
        self.coder = coder.to(device)
        self.recipe = coder.recipe
        # fused: one pass over each weight with its step count on the weights' device (the unfused Adam reads the
        # count to the host for every weight, every step)
        self.optimizer = torch.optim.Adam(self.coder.parameters(), lr=self.recipe.default_lr(coder.d_sae),
                                          betas=BETAS, fused=True)
        self.base_lr = self.recipe.default_lr(coder.d_sae)
        self.steps_done = 0
        self.label = "the dictionary"  # how messages name it (the training loop: its name and Site)

    @classmethod
    def new(cls, recipe: Recipe, d_in: int, d_out: int | None = None, transcoder: bool = False, skip: bool = False,
            device: torch.device | str = "cpu", sites: str | None = None) -> "Trainer":
        """A fresh dictionary's trainer; `sites` (the labels of the Sites it reads and writes; None: none) seeds its
        initial weights with the recipe's seed (resid.analyses.training.coder.init_seed)."""
        if transcoder and recipe.normalize == "constant_norm_rescale":
            raise ResidError("normalize='constant_norm_rescale' is for SAEs: a transcoder's output is another "
                             "tensor, which its input's norm cannot rescale (SAELens refuses it too); "
                             "'expected_average_only_in' scales each side by its own constant.")
        coder = CODERS[recipe.activation](d_in, d_out if d_out is not None else d_in, recipe, transcoder, skip, sites)
        return cls(coder, device)

    def step(self, x: Tensor, y: Tensor | None = None) -> Stats:
        """One optimizer step on the batch x (target y; x for an SAE)."""
        return step_together([self], [(x, y)])[0]

    def _compute(self, x: Tensor, y: Tensor | None, dead: bool) -> _Computed:
        """The loss of the batch and its gradients (dead: whether a feature may be dead, see Coder.loss)."""
        coder, step = self.coder, self.steps_done
        y = x if y is None else y
        x, y = x.float(), y.float()
        if step == 0:  # b_dec and the normalisation constants, from the first batch (a resumed run has its own)
            coder.start(x, y)
        x, y = coder.normalise(x, y)
        loss, acts, y_hat = coder.loss(x, y, step, dead=dead)
        loss.backward()
        with torch.no_grad():
            active = acts > 0
            l0 = active.sum(-1).float().mean()
            fvu = (y - y_hat).pow(2).sum() / (y - y.mean(0)).pow(2).sum()
            fired = active.any(0)
        return _Computed(loss.detach(), l0, fvu, fired, len(x))

    def _take(self, computed: _Computed) -> Stats:
        """The optimizer step on the gradients `computed` left, the schedule's learning rate, the decoder's norm."""
        coder, step = self.coder, self.steps_done
        coder.before_step()
        if self.recipe.clip is not None:
            torch.nn.utils.clip_grad_norm_(coder.parameters(), self.recipe.clip)
        for group in self.optimizer.param_groups:
            group["lr"] = self.base_lr * self.recipe.lr_factor(step)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        coder.after_step()
        with torch.no_grad():
            coder.count(computed.fired, computed.rows)
            dead = coder.dead().float().mean()
        self.steps_done += 1
        return Stats(computed.loss, computed.l0, computed.fvu, dead)

    # --- the non-finite checks -----------------------------------------------------------------------------
    def _check_step(self, loss: Tensor, step: int) -> None:
        """Stop before the optimizer step if the loss or a gradient is not finite (step_together asks this of every
        trainer only when their sum is not). A cause found among the weights (put there by an earlier step) is
        named before the loss it made."""
        grads = [(f"the gradient of {n}", p.grad) for n, p in self.coder.named_parameters() if p.grad is not None]
        # one summing pass per tensor (isfinite().all() on every gradient cost a tenth of a CPU step): resid.finite
        if all_finite(loss, *(g for _, g in grads)):
            return
        raise self._error(step, self._first_non_finite() or first_non_finite([("the loss", loss), *grads]))

    def _first_non_finite(self) -> str | None:
        """The first of the weights, buffers and Adam moments holding a NaN or an infinity, by name; None if none."""
        names = {id(p): n for n, p in self.coder.named_parameters()}
        tensors = [*self.coder.state_dict().items(),
                   *((f"Adam's {key} of {names[id(p)]}", v) for p, state in self.optimizer.state.items()
                     for key, v in state.items())]
        return first_non_finite((name, t) for name, t in tensors if torch.is_tensor(t))  # on their device

    def check_finite(self) -> None:
        """Refuse a state holding a NaN or an infinity (before it is checkpointed or exported)."""
        culprit = self._first_non_finite()
        if culprit is not None:
            raise self._error(self.steps_done - 1, culprit)

    def _error(self, step: int, culprit: str) -> ResidError:
        recipe = self.recipe
        return ResidError(
            f"Training stopped in step {step + 1} of {recipe.steps}: {culprit} of {self.label} is not finite (NaN or "
            f"infinite), so the dictionary would be NaN; nothing of this step was kept, and a checkpoint holds the "
            f"last good state. Usually the learning rate is too high for these activations "
            f"({param('lr', self.base_lr)}; try 10x lower) or a sparsity coefficient is too large; change it and "
            f"start over (a checkpoint of other settings is not resumed: delete it or choose another folder)."
        )

    # --- checkpoints -----------------------------------------------------------------------------------------
    def state(self) -> dict[str, Tensor]:
        """Every tensor a resumed run needs: parameters, buffers, Adam's moments and step counts."""
        tensors = {f"coder.{k}": v.detach().cpu() for k, v in self.coder.state_dict().items()}
        names = {id(p): n for n, p in self.coder.named_parameters()}
        for weight, state in self.optimizer.state.items():
            for key, value in state.items():
                tensors[f"adam.{names[id(weight)]}.{key}"] = torch.as_tensor(value).detach().cpu()
        return tensors

    def restore(self, tensors: dict[str, Tensor], steps_done: int) -> None:
        """Take up a saved state(), each tensor checked against this trainer's own (a DamagedState naming the first
        that is missing or of another shape or dtype, or one the state should not have)."""
        device = next(self.coder.parameters()).device
        state = {}
        for name, like in self.coder.state_dict().items():
            if name in ("in_scale", "out_scale") and f"coder.{name}" not in tensors:
                state[name] = torch.ones(())  # checkpoints from before expected-average normalisation: unscaled
            else:
                state[name] = expect(tensors, f"coder.{name}", like)
        adam = {}
        for name, weight in self.coder.named_parameters():
            likes = {"step": torch.zeros(()), "exp_avg": weight, "exp_avg_sq": weight}
            if steps_done == 0 and not any(f"adam.{name}.{key}" in tensors for key in likes):
                continue  # saved before the first step: Adam has no state yet
            adam[weight] = {key: expect(tensors, f"adam.{name}.{key}", like) for key, like in likes.items()}
        known = {f"coder.{name}" for name in state} | {f"adam.{n}.{key}" for n, _ in self.coder.named_parameters()
                                                       for key in ("step", "exp_avg", "exp_avg_sq")}
        extra = sorted(set(tensors) - known)
        if extra:
            raise DamagedState(f"it has tensors this dictionary does not ({', '.join(extra[:4])})")
        self.coder.load_state_dict(state)
        for weight, saved in adam.items():  # fused Adam keeps its step count beside the weights
            self.optimizer.state[weight] = {key: v.to(device) for key, v in saved.items()}
        self.steps_done = steps_done


def step_together(trainers: Sequence[Trainer], batches: Sequence[tuple[Tensor, Tensor | None]]) -> list[Stats]:
    """One optimizer step of each trainer on its batch (x, target y or None), with two synchronisations for all of
    them, however many: whether any of their features may be dead (the recipes with an AuxK loss compute it only
    then), and whether every loss and gradient is finite, asked before any weight changes, so that a non-finite one
    stops every trainer with the weights of the step before (naming the first culprit)."""
    aux = [t for t in trainers if t.coder.uses_dead]
    flags = torch.stack([t.coder.dead().any() for t in aux]).tolist() if aux else []
    dead = {id(t): flag for t, flag in zip(aux, flags)}
    computed = [t._compute(x, y, dead.get(id(t), False)) for t, (x, y) in zip(trainers, batches, strict=True)]
    grads = [p.grad for t in trainers for p in t.coder.parameters() if p.grad is not None]
    if not all_finite(*(c.loss for c in computed), *grads):
        for t, c in zip(trainers, computed):
            t._check_step(c.loss, t.steps_done)  # raises for the first that is not finite
    return [t._take(c) for t, c in zip(trainers, computed)]


def fit(trainer: Trainer, batches: Iterable[Tensor | tuple[Tensor, Tensor]]) -> list[Stats]:
    """Steps over `batches` (x, or (x, y) for a transcoder); the stats of each."""
    return [trainer.step(*(b if isinstance(b, tuple) else (b,))) for b in batches]
