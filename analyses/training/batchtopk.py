"""BatchTopK (Bussmann et al. 2024), as dictionary_learning's BatchTopKTrainer trains it (read for this):

    acts = relu(pre) kept at its k * batch largest entries over the whole batch (tokens may use more or fewer than k)
    loss = sum_d (y - y^)^2 (mean over tokens) + auxk_alpha * aux
    aux  = sum (e - e^)^2 / sum (e - mean(e))^2, k_aux = d_out // 2 (OpenAI's normalisation, by the residual's
           variance; no n_dead scaling), e the detached residual

After recipe.threshold_start_step steps, a threshold tracks the smallest non-zero activation of each batch as a
moving average (weight threshold_beta = 0.999); at inference a feature fires when relu(pre) > threshold, so the
dictionary is exported as a JumpReLU with that one threshold for every feature (as SAELens saves BatchTopK SAEs).
The decoder reads only the kept entries' rows (Coder.decode_sparse). Decoder rows are unit norm as in topk;
dictionary_learning also clips the gradient norm at 1.0 (recipe.clip).
"""

import torch
from torch import Tensor

from resid.analyses.training.coder import Coder, auxk_loss, variance


def batch_top_k(pre: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """relu(pre) kept at its k * rows largest entries over the whole batch, as (values, token, feature) of the kept
    entries, sorted by token."""
    values, flat = torch.relu(pre).flatten().topk(k * pre.shape[0], sorted=False)
    flat, order = flat.sort()
    return values[order], flat // pre.shape[1], flat % pre.shape[1]


class BatchTopKCoder(Coder):
    unit_norm = True
    activation = "jumprelu"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_buffer("threshold", torch.tensor(-1.0))  # negative: not tracked yet

    def loss(self, x: Tensor, y: Tensor, step: int) -> tuple[Tensor, Tensor, Tensor]:
        pre = self.pre(x)
        values, token, feature = batch_top_k(pre, self.recipe.k)
        with torch.no_grad():
            acts = torch.zeros_like(pre).index_put_((token, feature), values)
        if step > self.recipe.threshold_start_step:
            self._track(acts)
        counts = torch.bincount(token, minlength=len(x))
        y_hat = self.decode_sparse(feature, values, x, offsets=torch.cumsum(counts, 0) - counts)
        residual = (y - y_hat).detach()
        aux = auxk_loss(self, pre, residual, self.d_out // 2, variance(residual))
        return (y - y_hat).pow(2).sum(-1).mean() + self.recipe.auxk_alpha * aux, acts, y_hat

    @torch.no_grad()
    def _track(self, acts: Tensor) -> None:
        active = acts[acts > 0]
        smallest = active.min().float() if active.numel() else acts.new_zeros((), dtype=torch.float32)
        beta = self.recipe.threshold_beta
        self.threshold.copy_(smallest if self.threshold < 0 else beta * self.threshold + (1 - beta) * smallest)

    def export_fields(self) -> dict:
        threshold = float(self.threshold.clamp_min(0))  # never tracked: relu, the threshold 0
        return {"activation": "jumprelu", "threshold": torch.full((self.d_sae,), threshold)}
