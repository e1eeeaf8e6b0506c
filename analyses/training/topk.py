"""TopK with the AuxK loss for dead features, as sparsify (EleutherAI) trains it, after Gao et al. 2024
("Scaling and evaluating sparse autoencoders"), read for this:

    acts = the k largest of relu(pre) per token, the rest zero
    fvu  = sum (y - y^)^2 / sum (y - mean(y))^2                 (over the batch)
    aux  = min(n_dead / k_aux, 1) * sum (e - e^)^2 / sum (y - mean(y))^2,   k_aux = d_out // 2,
           e = y - y^ (detached), e^ the top k_aux dead features' decode without b_dec
    loss = fvu + auxk_alpha * aux

A feature is dead after recipe.dead_tokens tokens without firing (sparsify's dead_feature_threshold, 10M).
The decoder reads only the k active rows per token (Coder.decode_sparse, as sparsify's decoder does).
Decoder rows are unit norm: the gradient's component along each row is removed before the step and the rows are
renormalised after it. sparsify's default learning rate is 2e-4 / sqrt(d_sae / 2^14) with Adam.
"""

import torch
from torch import Tensor

from resid.analyses.training.coder import Coder, auxk_loss, variance
from resid.dictionaries import ActivationFunction


def top_k(pre: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """relu(pre) kept at its k largest per row, as (values, index) [token k] each."""
    values, index = pre.topk(k, dim=-1, sorted=False)
    return torch.relu(values), index


class TopKCoder(Coder):
    unit_norm = True
    uses_dead = True
    activation = "topk"

    def loss(self, x: Tensor, y: Tensor, step: int, dead: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        pre = self.pre(x)
        values, index = top_k(pre, self.recipe.k)
        y_hat = self.decode_sparse(index, values, x)
        with torch.no_grad():
            acts = torch.zeros_like(pre).scatter(-1, index, values)
        total = variance(y)
        fvu = (y - y_hat).pow(2).sum(-1).mean() / total
        if not dead:
            return fvu, acts, y_hat
        k_aux = self.d_out // 2
        scale = (self.dead().sum() / k_aux).clamp(max=1.0)
        aux = auxk_loss(self, pre, (y - y_hat).detach(), k_aux, total)
        return fvu + self.recipe.auxk_alpha * scale * aux, acts, y_hat

    def exported_activation(self) -> ActivationFunction:
        return ActivationFunction("topk", k=self.recipe.k)
