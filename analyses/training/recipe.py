"""How a dictionary is trained: one Recipe per run, the same for every site the run trains.

Activation functions and the library whose recipe each follows (read for this; see the trainer modules):

    relu       SAELens 6's "standard" training SAE: MSE + l1_coefficient * decoder-norm-weighted L1
    topk       sparsify (EleutherAI) / Gao et al. 2024: FVU + auxk_alpha * AuxK, unit-norm decoder rows
    batchtopk  dictionary_learning's BatchTopKTrainer (Bussmann et al. 2024), exported as a JumpReLU threshold
    jumprelu   SAELens 6's JumpReLU training SAE (Rajamanoharan et al. 2024): MSE + l0_coefficient * L0 through a
               straight-through estimator with a rectangle kernel of width `bandwidth`

Schedule (all recipes): Adam (betas 0.9, 0.999); the learning rate rises linearly over `warmup_steps` (sparsify,
dictionary_learning: 1000 steps) as the followed library ramps it (topk, batchtopk: step / warmup_steps, zero at
step 0, as sparsify's and dictionary_learning's schedules; relu, jumprelu: (step + 1) / warmup_steps, as SAELens's
LinearLR from 1 / warmup_steps), stays at `lr`, and falls linearly to 0 over the last `decay_steps` (SAELens's
lr_decay_steps; dictionary_learning's decay_start is steps - decay_steps). The sparsity coefficient
rises linearly over `sparsity_warmup_steps` (SAELens's l1_warm_up_steps / l0_warm_up_steps).
"""

import math
from dataclasses import dataclass
from typing import Literal

from resid.config import finite_number
from resid.errors import ResidError, param

Kind = Literal["relu", "topk", "batchtopk", "jumprelu"]
KINDS = ("relu", "topk", "batchtopk", "jumprelu")
BDecInit = Literal["geometric_median", "mean", "zeros"]
Normalize = Literal["none", "constant_norm_rescale", "expected_average_only_in"]
NORMALIZE = ("none", "constant_norm_rescale", "expected_average_only_in")
# Adam moves every weight by about lr per step whatever the gradient's size, so an lr of 1 already moves a unit-norm
# decoder row by its whole length each step; the recipes' defaults are 1e-4 to 1e-3 (2e-4 / sqrt(d_sae / 2^14))
MAX_LR = 1.0
# the real-valued settings: (name, what they must be); a NaN or an infinity in any of them trains a NaN dictionary
NON_NEGATIVE = ("l1_coefficient", "l0_coefficient", "auxk_alpha")
POSITIVE = ("bandwidth", "init_threshold")
POSITIVE_OR_NONE = ("clip", "decoder_init_norm")


@dataclass(frozen=True)
class Recipe:
    """The settings of a training run (defaults: the followed library's, scaled to short runs where noted)."""

    activation: Kind = "topk"
    expansion: int = 8  # d_sae = expansion * d_in (ignored when d_sae is given)
    d_sae: int | None = None
    k: int = 32  # topk, batchtopk: active features per token (batchtopk: on average over the batch)
    steps: int = 1000
    batch_size: int = 4096  # tokens per optimizer step
    lr: float | None = None  # None: the recipe's default (see default_lr)
    warmup_steps: int = 100  # sparsify / dictionary_learning use 1000 on runs of tens of thousands of steps
    decay_steps: int = 0  # linear decay to zero over the last decay_steps
    l1_coefficient: float = 5.0  # relu (SAELens's default is 1.0; activations here are not rescaled to norm sqrt(d))
    l0_coefficient: float = 1.0  # jumprelu (SAELens's default)
    sparsity_warmup_steps: int = 0
    bandwidth: float = 0.05  # jumprelu: the straight-through estimator's kernel width (SAELens's default)
    init_threshold: float = 0.01  # jumprelu: the initial threshold (SAELens's default)
    auxk_alpha: float = 1 / 32  # topk, batchtopk (sparsify, dictionary_learning)
    dead_tokens: int = 10_000_000  # a feature is dead after this many tokens without firing (both libraries)
    threshold_beta: float = 0.999  # batchtopk: the threshold's moving-average weight (dictionary_learning)
    threshold_start_step: int = 100  # batchtopk: steps before the threshold is tracked (dictionary_learning: 1000)
    clip: float | None = None  # gradient norm clip (dictionary_learning clips at 1.0; sparsify and SAELens do not)
    b_dec_init: BDecInit = "geometric_median"  # from the first batch (sparsify, dictionary_learning; SAELens option)
    decoder_init_norm: float | None = None  # None: the recipe's (relu, jumprelu: SAELens's 0.1; topk: unit rows)
    seed: int = 0  # of the initialisation and of the data order
    # SAELens's normalize_activations: "constant_norm_rescale" (SAEs only) trains on x * sqrt(d_in) / |x| (target
    # scaled alike), and the saved dictionary rescales its input and output so; "expected_average_only_in" trains
    # on x times one constant, sqrt(d_in) / the first batch's mean |x| (a transcoder's target by its own constant,
    # sqrt(d_out) / mean |y|: resid's extension), folded into the saved weights as SAELens folds it
    normalize: Normalize = "none"

    @classmethod
    def for_budget(cls, tokens: int, batch_size: int, transcoder: bool = False, **settings) -> "Recipe":
        """A recipe for `tokens` training tokens in batches of `batch_size`, its schedule scaled to the run (the
        defaults of `resid train-*`): warm-up over 5% of the steps, decay over the last 20%, BatchTopK's threshold
        tracked from a tenth of them and averaged over a quarter (dictionary_learning's 1000 steps at most, so that a
        short run exports the threshold of its last steps, not of its first), features dead after a tenth of the
        tokens, transcoders normalised by expected_average_only_in. `settings` override these; None keeps them."""
        steps = tokens // batch_size
        scaled = dict(steps=steps, batch_size=batch_size, warmup_steps=steps // 20, decay_steps=steps // 5,
                      threshold_start_step=min(1000, steps // 10),
                      threshold_beta=1 - 1 / max(1, min(1000, steps // 4)),
                      dead_tokens=min(10_000_000, max(batch_size, tokens // 10)),
                      normalize="expected_average_only_in" if transcoder else "none")
        return cls(**{**scaled, **{name: value for name, value in settings.items() if value is not None}})

    def __post_init__(self) -> None:
        problems = []
        if self.activation not in KINDS:
            problems.append(f"{param('activation', self.activation)} must be one of {', '.join(KINDS)}")
        for name in ("expansion", "k", "steps", "batch_size", "dead_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{param(name, value)} must be a positive integer")
        if self.d_sae is not None and self.d_sae < 1:
            problems.append(f"{param('d_sae', self.d_sae)} must be positive")
        if not 0 <= self.warmup_steps + self.decay_steps <= self.steps:
            problems.append(f"{param('warmup_steps', self.warmup_steps)} + {param('decay_steps', self.decay_steps)} "
                            f"must be at most {param('steps', self.steps)}")
        if self.b_dec_init not in ("geometric_median", "mean", "zeros"):
            problems.append(f"{param('b_dec_init', self.b_dec_init)} must be geometric_median, mean or zeros")
        if self.normalize not in NORMALIZE:
            problems.append(f"{param('normalize', self.normalize)} must be one of {', '.join(NORMALIZE)}")
        if self.d_sae is not None and isinstance(self.k, int) and self.activation in ("topk", "batchtopk") \
                and self.k >= self.d_sae:
            problems.append(f"{param('k', self.k)} must be less than {param('d_sae', self.d_sae)} (k of the d_sae "
                            "features fire per token)")
        problems += self._real_problems()
        if problems:
            raise ResidError("Invalid Recipe: " + "; ".join(problems) + ".")

    def _real_problems(self) -> list[str]:
        """The real-valued settings that are not finite numbers in their range."""
        problems = []

        def real(name: str, value: object, need: str, ok: bool) -> None:
            if not finite_number(value):
                problems.append(f"{param(name, value)} must be a finite number, {need}")
            elif not ok:
                problems.append(f"{param(name, value)} must be {need}")

        for name in NON_NEGATIVE:
            value = getattr(self, name)
            real(name, value, "zero or more", isinstance(value, (int, float)) and value >= 0)
        for name in POSITIVE:
            value = getattr(self, name)
            real(name, value, "positive", isinstance(value, (int, float)) and value > 0)
        for name in POSITIVE_OR_NONE:
            value = getattr(self, name)
            if value is not None:
                real(name, value, "positive, or None", isinstance(value, (int, float)) and value > 0)
        beta = self.threshold_beta
        real("threshold_beta", beta, "in [0, 1)", isinstance(beta, (int, float)) and 0 <= beta < 1)
        if self.lr is not None:
            real("lr", self.lr, f"positive and at most {MAX_LR:g} (Adam moves every weight by about lr per step "
                 "whatever the gradient, so a larger one overflows the weights; the recipes' defaults are 1e-4 to "
                 "1e-3)",
                 isinstance(self.lr, (int, float)) and 0 < self.lr <= MAX_LR)
        return problems

    def width(self, d_in: int) -> int:
        """d_sae for an input of width d_in."""
        return self.d_sae if self.d_sae is not None else self.expansion * d_in

    def check_width(self, d_in: int, what: str) -> int:
        """d_sae for an input of width d_in, checked against k (`what` names the input in the message)."""
        d_sae = self.width(d_in)
        if self.activation in ("topk", "batchtopk") and self.k >= d_sae:
            via = param("d_sae", d_sae) if self.d_sae is not None else \
                f"{param('expansion', self.expansion)} x its input's width {d_in}"
            raise ResidError(f"{param('k', self.k)} must be less than the {d_sae} features of the dictionary {what}, "
                             f"{via}: k of them fire per token. Lower k below {d_sae}, or widen the dictionary.")
        return d_sae

    def default_lr(self, d_sae: int) -> float:
        """sparsify / dictionary_learning (topk, batchtopk): 2e-4 / sqrt(d_sae / 2^14), Gao et al.'s scaling law;
        SAELens (relu, jumprelu): 3e-4... scaled the same way here, so that small dictionaries train quickly."""
        if self.lr is not None:
            return self.lr
        return 2e-4 / math.sqrt(d_sae / 2**14) if self.activation in ("topk", "batchtopk") else \
            3e-4 / math.sqrt(d_sae / 2**14)

    def lr_factor(self, step: int) -> float:
        """The learning rate of step `step` (0-based) as a fraction of lr: warm-up, constant, decay."""
        if step < self.warmup_steps:  # SAELens's ramp starts at 1 / warmup_steps, the other two libraries' at 0
            return (step + (self.activation in ("relu", "jumprelu"))) / self.warmup_steps
        if self.decay_steps and step >= self.steps - self.decay_steps:
            return (self.steps - step) / self.decay_steps
        return 1.0

    def sparsity_factor(self, step: int) -> float:
        """The sparsity coefficient's fraction at step `step` (SAELens's coefficient warm-up)."""
        if step >= self.sparsity_warmup_steps:
            return 1.0
        return (step + 1) / self.sparsity_warmup_steps
