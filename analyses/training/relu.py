"""ReLU + L1, as SAELens 6's "standard" training SAE (StandardTrainingSAE, read for this):

    acts = relu(pre)
    loss = sum_d (y - y^)^2 (mean over tokens) + l1_coefficient * sum_i acts_i * |W_dec[i]| (mean over tokens)

The L1 is weighted by each decoder row's norm, so shrinking the activations while growing the decoder does not
lower it; the decoder is therefore left free (decoder rows start at norm 0.1, SAELens's decoder_init_norm). The
coefficient rises over recipe.sparsity_warmup_steps (SAELens's l1_warm_up_steps).
"""

import torch
from torch import Tensor

from resid.analyses.training.coder import Coder, mse


class ReLUCoder(Coder):
    unit_norm = False
    activation = "relu"

    def loss(self, x: Tensor, y: Tensor, step: int, dead: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        acts = torch.relu(self.pre(x))
        y_hat = self.decode(acts, x)
        l1 = (acts * self.W_dec.norm(dim=1)).sum(-1).mean()
        coefficient = self.recipe.l1_coefficient * self.recipe.sparsity_factor(step)
        return mse(y, y_hat) + coefficient * l1, acts, y_hat
