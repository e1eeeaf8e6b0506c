"""The trainable part shared by every recipe: weights, their initialisation, the decoder's unit norm, the count of
tokens since each feature fired, and the export to a resid Dictionary.

Axes: `token` the rows of a training batch, `d_in` / `d_out` the widths read and reconstructed (equal for an SAE),
`feature` the d_sae learned features.

    pre  = (x - b_dec * apply_b_dec_to_input) @ W_enc + b_enc          (b_dec is subtracted for SAEs only)
    y^   = acts @ W_dec + b_dec (+ x @ W_skip for skip transcoders)

Initialisation (every library read agrees): decoder rows drawn at random (from a generator seeded by the recipe's
seed and the dictionary's Sites, `init_seed`) and scaled to `decoder_init_norm` (unit
norm for TopK / BatchTopK, 0.1 for SAELens's ReLU and JumpReLU), the encoder the decoder's transpose (a transcoder
whose d_in differs from d_out: an independent draw of the same norm), b_enc zero, W_skip zero, and b_dec set from
the first batch's targets (`Recipe.b_dec_init`: geometric median, mean or zeros). With Recipe.normalize
"expected_average_only_in", inputs and targets are multiplied by constants fixed on the first batch (their mean
norm becomes sqrt(width)), and the export folds them into the weights.
"""

import hashlib

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from resid.analyses.training.recipe import Recipe
from resid.dictionaries import ActivationFunction, Binding, Dictionary, InputNormalization, Weights


def init_seed(seed: int, sites: str | None) -> int:
    """The seed of one dictionary's initial weights: the recipe's `seed` mixed with `sites`, the labels of the Sites
    it reads and writes, by a stable hash (sha256, never Python's hash(), which is salted per process). So the
    dictionaries of one run start from different matrices (one seed for all gave an SAE and a transcoder decoder
    rows of cosine 0.9998), and a dictionary starts the same trained alone or beside others. Without Sites (a
    Trainer made directly), the recipe's seed itself."""
    if sites is None:
        return seed
    return int.from_bytes(hashlib.sha256(f"{seed}\0{sites}".encode()).digest()[:8], "little") >> 1  # < 2**63


class Coder(nn.Module):
    """One dictionary being trained. Subclasses (one per recipe) define `loss` and may add parameters."""

    unit_norm: bool = False  # decoder rows kept at unit norm (and their parallel gradient removed)
    uses_dead: bool = False  # the loss has a term for dead features (AuxK), computed only while some may be dead
    activation: str = "relu"  # the exported Dictionary's activation

    def __init__(self, d_in: int, d_out: int, recipe: Recipe, transcoder: bool = False, skip: bool = False,
                 sites: str | None = None):
        super().__init__()
        self.recipe, self.transcoder = recipe, transcoder
        self.d_in, self.d_out, self.d_sae = d_in, d_out, recipe.width(d_in)
        g = torch.Generator().manual_seed(init_seed(recipe.seed, sites))
        norm = recipe.decoder_init_norm if recipe.decoder_init_norm is not None else (1.0 if self.unit_norm else 0.1)
        W_dec = torch.randn(self.d_sae, d_out, generator=g)
        W_dec = norm * W_dec / W_dec.norm(dim=1, keepdim=True)
        if d_in == d_out:
            W_enc = W_dec.T.clone()
        else:
            W_enc = torch.randn(d_in, self.d_sae, generator=g)
            W_enc = norm * W_enc / W_enc.norm(dim=0, keepdim=True)
        self.W_enc = nn.Parameter(W_enc.contiguous())
        self.b_enc = nn.Parameter(torch.zeros(self.d_sae))
        self.W_dec = nn.Parameter(W_dec)
        self.b_dec = nn.Parameter(torch.zeros(d_out))
        self.W_skip = nn.Parameter(torch.zeros(d_in, d_out)) if skip else None
        self.apply_b_dec_to_input = not transcoder
        # tokens since each feature last fired (dead features: >= recipe.dead_tokens), and whether b_dec was set
        self.register_buffer("since_fired", torch.zeros(self.d_sae, dtype=torch.long))
        self.register_buffer("initialised", torch.zeros((), dtype=torch.bool))
        # the constants inputs and targets are multiplied by in training (Recipe.normalize "expected_average_only_in")
        self.register_buffer("in_scale", torch.ones(()))
        self.register_buffer("out_scale", torch.ones(()))

    # --- the maths -------------------------------------------------------------------------------------------
    def pre(self, x: Float[Tensor, "token d_in"]) -> Float[Tensor, "token feature"]:
        x = x - self.b_dec if self.apply_b_dec_to_input else x
        return x @ self.W_enc + self.b_enc

    def decode(self, acts: Float[Tensor, "token feature"], x: Float[Tensor, "token d_in"]
               ) -> Float[Tensor, "token d_out"]:
        out = acts @ self.W_dec + self.b_dec
        return out + x @ self.W_skip if self.W_skip is not None else out

    def decode_sparse(self, index: Tensor, values: Tensor, x: Float[Tensor, "token d_in"],
                      offsets: Tensor | None = None) -> Float[Tensor, "token d_out"]:
        """`decode` of activations given by their non-zero entries: index and values [token k] (k per token), or
        flat [entry] with `offsets` [token] (each token's first entry; entries sorted by token). A gather of the
        active decoder rows (torch's embedding_bag), so a TopK step costs k rows per token instead of a dense
        [token feature] @ [feature d_out] product and its gradient (as sparsify decodes)."""
        out = F.embedding_bag(index, self.W_dec, offsets, mode="sum", per_sample_weights=values) + self.b_dec
        return out + x @ self.W_skip if self.W_skip is not None else out

    def loss(self, x: Tensor, y: Tensor, step: int, dead: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        """(loss, feature activations, reconstruction) of a batch: x the input, y the target (x for an SAE). dead:
        whether a feature may be dead, for the recipes whose loss has a term for dead features (`uses_dead`):
        False leaves it out, as zero (the trainer asks every dictionary's once per step, in one synchronisation)."""
        raise NotImplementedError

    # --- around the optimizer step ---------------------------------------------------------------------------
    def normalise(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """A batch as the recipe trains on it (Recipe.normalize): constant_norm_rescale scales both by each row's
        sqrt(d_in) / |x|, as the saved Dictionary rescales (SAELens's); expected_average_only_in multiplies them by
        the constants of the first batch (start), which the export folds into the weights."""
        if self.recipe.normalize == "constant_norm_rescale":
            scale = self.d_in**0.5 / x.norm(dim=-1, keepdim=True)
            return x * scale, y * scale
        if self.recipe.normalize == "expected_average_only_in":
            return x * self.in_scale, y * self.out_scale
        return x, y

    @torch.no_grad()
    def start(self, x: Float[Tensor, "token d_in"], y: Float[Tensor, "token d_out"]) -> None:
        """From the first batch (once; a resumed run keeps its own): the normalisation constants, then b_dec from
        the scaled targets."""
        if bool(self.initialised):
            return
        if self.recipe.normalize == "expected_average_only_in":
            mean_norm = lambda t: max(float(t.norm(dim=-1).mean()), 1e-12)  # noqa: E731
            self.in_scale.fill_(self.d_in**0.5 / mean_norm(x))
            self.out_scale.fill_(self.d_out**0.5 / mean_norm(y) if self.transcoder else float(self.in_scale))
        y = self.normalise(x, y)[1]
        method = self.recipe.b_dec_init
        if method == "mean":
            self.b_dec.copy_(y.mean(0))
        elif method == "geometric_median":
            self.b_dec.copy_(geometric_median(y))
        self.initialised.fill_(True)

    @torch.no_grad()
    def count(self, fired: Tensor, rows: int) -> None:
        """Tokens since each feature fired, after a batch of `rows` tokens in which `fired` (a mask of the features)
        did."""
        self.since_fired.add_(rows).masked_fill_(fired, 0)

    def dead(self) -> Tensor:
        return self.since_fired >= self.recipe.dead_tokens

    @torch.no_grad()
    def before_step(self) -> None:
        """Remove the part of the decoder's gradient that would change its rows' norms (unit-norm recipes)."""
        if self.unit_norm and self.W_dec.grad is not None:
            rows = self.W_dec / self.W_dec.norm(dim=1, keepdim=True)
            self.W_dec.grad -= (self.W_dec.grad * rows).sum(1, keepdim=True) * rows

    @torch.no_grad()
    def after_step(self) -> None:
        if self.unit_norm:
            self.W_dec /= self.W_dec.norm(dim=1, keepdim=True)

    # --- export ----------------------------------------------------------------------------------------------
    def exported_activation(self) -> ActivationFunction:
        """The exported Dictionary's activation function (its kind, thresholds, k)."""
        return ActivationFunction(self.activation)

    def dictionary(self, hook_in: str | None = None, hook_out: str | None = None, name: str = "dictionary",
                   model_name: str | None = None, metadata: dict | None = None) -> Dictionary:
        """The trained dictionary as a resid Dictionary (float32, on the CPU), ready for model.run(dictionaries=)
        and the SAELens writer. Expected-average constants are folded into the weights (as SAELens's
        fold_activation_norm_scaling_factor; the pre-activations, so thresholds and top-k, are unchanged):
        W_enc * in_scale, and W_dec, b_dec divided by out_scale, W_skip * in_scale / out_scale."""
        take = lambda t: t.detach().float().cpu().clone()  # noqa: E731
        s_in, s_out = float(self.in_scale), float(self.out_scale)
        normalize, metadata = self.recipe.normalize, dict(metadata or {})
        if normalize == "expected_average_only_in":  # recorded, and already in the weights
            normalize, metadata["folded_scaling_factors"] = "none", {"in": s_in, "out": s_out}
        return Dictionary(
            Weights(take(self.W_enc) * s_in, take(self.W_dec) / s_out, take(self.b_dec) / s_out, take(self.b_enc),
                    None if self.W_skip is None else take(self.W_skip) * s_in / s_out),
            self.exported_activation(), normalization=InputNormalization(normalize, self.apply_b_dec_to_input),
            binding=Binding(hook_in, hook_out, transcoder=self.transcoder), name=name, format="resid-trained",
            model_name=model_name, metadata=metadata,
        )


def mse(y: Tensor, y_hat: Tensor) -> Tensor:
    """Squared error summed over the features of a token, mean over tokens (SAELens, dictionary_learning)."""
    return (y - y_hat).pow(2).sum(-1).mean()


def geometric_median(points: Float[Tensor, "token d"], iterations: int = 100, tol: float = 1e-5
                     ) -> Float[Tensor, "d"]:
    """Weiszfeld's iteration from the mean (as dictionary_learning and sparsify compute it)."""
    guess = points.mean(0)
    for _ in range(iterations):
        weights = 1 / (points - guess).norm(dim=1).clamp_min(1e-8)
        new = (weights[:, None] * points).sum(0) / weights.sum()
        if (new - guess).norm() < tol:
            return new
        guess = new
    return guess


def auxk_loss(coder: Coder, pre: Tensor, residual: Tensor, k_aux: int, variance: Tensor) -> Tensor:
    """The AuxK loss of Gao et al. 2024: the top k_aux dead features (by relu(pre)) reconstruct the main
    reconstruction's residual (detached) through the decoder without its bias; the squared error summed over
    features, mean over tokens, divided by `variance` (each recipe says which). Zero while no feature is dead.
    Without asking the host how many are dead: the k_aux largest of relu(pre) with the live features' entries at
    zero, where a live feature (or a dead one at zero) adds a zero row, so that fewer than k_aux dead features give
    the sum of theirs."""
    dead = coder.dead()
    relu = torch.relu(pre)
    values, index = torch.where(dead, relu, 0.0).topk(min(k_aux, relu.shape[-1]), dim=-1, sorted=False)
    e_hat = F.embedding_bag(index, coder.W_dec, mode="sum", per_sample_weights=values)
    return ((residual - e_hat).pow(2).sum(-1).mean() / variance * dead.any()).nan_to_num(0.0)


def variance(y: Float[Tensor, "token d"]) -> Tensor:
    """Summed squared deviation from the batch mean, mean over tokens (the denominator of the FVU)."""
    return (y - y.mean(0)).pow(2).sum(-1).mean()
