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
from resid.dictionaries import ActivationFunction


def batch_top_k(pre: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """relu(pre) kept at its k * rows largest entries over the whole batch, as (values, token, feature) of the kept
    entries, sorted by token. Chosen without a gradient and gathered with one, so that the backward touches the kept
    entries only (a relu and a top-k of the whole batch in the graph would each give back a gradient of its size);
    where fewer than k * rows are positive, the rest are the largest negative ones, which relu makes zeros as it
    makes any others."""
    entries = pre.reshape(-1)
    with torch.no_grad():
        flat = entries.topk(k * pre.shape[0], sorted=False).indices.sort().values
    # gather's gradient is a scatter-add (an index's would sort the indices first)
    return torch.relu(entries.gather(0, flat)), flat // pre.shape[1], flat % pre.shape[1]


def starts(token: Tensor, tokens: int) -> Tensor:
    """Where each of `tokens` tokens' entries start in `token` (sorted; embedding_bag's offsets): the entries of
    the tokens before it, found by binary search (a count of entries per token, bincount, asks the host for the
    largest token first)."""
    return torch.searchsorted(token, torch.arange(tokens, device=token.device))


@torch.no_grad()
def tracked(threshold: Tensor, values: Tensor, beta: float) -> Tensor:
    """The threshold after a batch whose kept activations are `values`: their smallest positive one (0 if none),
    which sets it the first time (while negative) and then moves its average with weight `beta`."""
    smallest = values.masked_fill(values <= 0, torch.inf).min().float()
    smallest = torch.where(smallest.isinf(), 0.0, smallest)
    return torch.where(threshold < 0, smallest, beta * threshold + (1 - beta) * smallest)


class BatchTopKCoder(Coder):
    unit_norm = True
    uses_dead = True
    activation = "jumprelu"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_buffer("threshold", torch.tensor(-1.0))  # negative: not tracked yet

    def loss(self, x: Tensor, y: Tensor, step: int, dead: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        pre = self.pre(x)
        values, token, feature = batch_top_k(pre, self.recipe.k)
        with torch.no_grad():
            acts = torch.zeros_like(pre).index_put_((token, feature), values)
        if step > self.recipe.threshold_start_step:
            self.threshold.copy_(tracked(self.threshold, values.detach(), self.recipe.threshold_beta))
        y_hat = self.decode_sparse(feature, values, x, offsets=starts(token, len(x)))
        mse = (y - y_hat).pow(2).sum(-1).mean()
        if not dead:
            return mse, acts, y_hat
        residual = (y - y_hat).detach()
        aux = auxk_loss(self, pre, residual, self.d_out // 2, variance(residual))
        return mse + self.recipe.auxk_alpha * aux, acts, y_hat

    def exported_activation(self) -> ActivationFunction:
        threshold = float(self.threshold.clamp_min(0))  # never tracked: relu, the threshold 0
        return ActivationFunction("jumprelu", torch.full((self.d_sae,), threshold))
