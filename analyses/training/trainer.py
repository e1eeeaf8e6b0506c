"""One dictionary's optimizer step: the recipe's loss, its gradient, Adam, the schedule, the decoder's norm.

    trainer = Trainer.new(Recipe(activation="topk", k=32), d_in=576)
    for x in batches:                     # [token d_in] float32 (a transcoder: trainer.step(x, y))
        stats = trainer.step(x)           # loss, l0, fvu, dead fraction of this step

`fit(trainer, batches)` runs the steps from a tensor of activations (synthetic data, tests). The model's
activations are fed by resid.analyses.training.loop, which trains several dictionaries from one forward pass.
"""

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from resid.analyses.training.batchtopk import BatchTopKCoder
from resid.analyses.training.coder import Coder
from resid.analyses.training.jumprelu import JumpReLUCoder
from resid.analyses.training.recipe import Recipe
from resid.analyses.training.relu import ReLUCoder
from resid.analyses.training.topk import TopKCoder
from resid.errors import ResidError

CODERS = {"relu": ReLUCoder, "topk": TopKCoder, "batchtopk": BatchTopKCoder, "jumprelu": JumpReLUCoder}
BETAS = (0.9, 0.999)  # Adam's, in every library followed


@dataclass(frozen=True)
class Stats:
    loss: float
    l0: float  # mean active features per token
    fvu: float  # fraction of variance unexplained, over the batch
    dead: float  # fraction of features dead (recipe.dead_tokens without firing)


class Trainer:
    """A Coder with its Adam optimizer and the number of steps done."""

    def __init__(self, coder: Coder, device: torch.device | str = "cpu"):
        self.coder = coder.to(device)
        self.recipe = coder.recipe
        self.optimizer = torch.optim.Adam(self.coder.parameters(), lr=self.recipe.default_lr(coder.d_sae),
                                          betas=BETAS)
        self.base_lr = self.recipe.default_lr(coder.d_sae)
        self.steps_done = 0

    @classmethod
    def new(cls, recipe: Recipe, d_in: int, d_out: int | None = None, transcoder: bool = False, skip: bool = False,
            device: torch.device | str = "cpu") -> "Trainer":
        if transcoder and recipe.normalize == "constant_norm_rescale":
            raise ResidError("normalize='constant_norm_rescale' is for SAEs: a transcoder's output is another "
                             "tensor, which its input's norm cannot rescale (SAELens refuses it too); "
                             "'expected_average_only_in' scales each side by its own constant.")
        coder = CODERS[recipe.activation](d_in, d_out if d_out is not None else d_in, recipe, transcoder, skip)
        return cls(coder, device)

    def step(self, x: Tensor, y: Tensor | None = None) -> Stats:
        """One optimizer step on the batch x (target y; x for an SAE)."""
        coder, step = self.coder, self.steps_done
        y = x if y is None else y
        x, y = x.float(), y.float()
        coder.start(x, y)
        x, y = coder.normalise(x, y)
        loss, acts, y_hat = coder.loss(x, y, step)
        loss.backward()
        coder.before_step()
        if self.recipe.clip is not None:
            torch.nn.utils.clip_grad_norm_(coder.parameters(), self.recipe.clip)
        for group in self.optimizer.param_groups:
            group["lr"] = self.base_lr * self.recipe.lr_factor(step)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        coder.after_step()
        with torch.no_grad():
            coder.count(acts)
            fvu = (y - y_hat).pow(2).sum() / (y - y.mean(0)).pow(2).sum()
            stats = Stats(float(loss), float((acts > 0).sum(-1).float().mean()), float(fvu),
                          float(coder.dead().float().mean()))
        self.steps_done += 1
        return stats

    # --- checkpoints -----------------------------------------------------------------------------------------
    def state(self) -> dict[str, Tensor]:
        """Every tensor a resumed run needs: parameters, buffers, Adam's moments and step counts."""
        tensors = {f"coder.{k}": v.detach().cpu() for k, v in self.coder.state_dict().items()}
        names = {id(p): n for n, p in self.coder.named_parameters()}
        for param, state in self.optimizer.state.items():
            for key, value in state.items():
                tensors[f"adam.{names[id(param)]}.{key}"] = torch.as_tensor(value).detach().cpu()
        return tensors

    def restore(self, tensors: dict[str, Tensor], steps_done: int) -> None:
        device = next(self.coder.parameters()).device
        state = {k[len("coder."):]: v for k, v in tensors.items() if k.startswith("coder.")}
        for name in ("in_scale", "out_scale"):  # checkpoints from before expected-average normalisation: unscaled
            state.setdefault(name, torch.ones(()))
        self.coder.load_state_dict(state)
        for name, param in self.coder.named_parameters():
            state = {key: tensors[f"adam.{name}.{key}"].to(device) for key in ("step", "exp_avg", "exp_avg_sq")
                     if f"adam.{name}.{key}" in tensors}
            if state:
                state["step"] = state["step"].cpu()  # Adam keeps its step count on the CPU unless fused/capturable
                self.optimizer.state[param] = state
        self.steps_done = steps_done


def fit(trainer: Trainer, batches: Iterable[Tensor | tuple[Tensor, Tensor]]) -> list[Stats]:
    """Steps over `batches` (x, or (x, y) for a transcoder); the stats of each."""
    return [trainer.step(*(b if isinstance(b, tuple) else (b,))) for b in batches]
