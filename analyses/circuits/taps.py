"""EAP's gradients without a probe: where nothing is patched, an EdgePass run with taps=True records what each
reader group's input goes into (a head's q_proj, a key/value head's k_proj and v, the MLP's normalized input, the
final residual); `input_gradients` pushes the gradients at those tensors back through W_Q[h], W_K[g] and W_V[g] and
the pre-norm's Jacobian at the layer's residual, every head of a layer in one batched vector-Jacobian product of the
norm's own forward: the numbers a zero probe on every reader's input gives (resid.analyses.circuits.patched), from
one backward pass that stops at the taps. `tappable` (patched.py: a property of the pass) says where that holds.
"""

import torch
from jaxtyping import Float
from torch import Tensor

from resid.analyses.circuits.patched import EdgePass, tappable


def input_gradients(edge_pass: EdgePass, value: Float[Tensor, ""]) -> Float[Tensor, "b pos reader d_model"]:
    """d value / d input_r of every reader (in float32 at least), from an EdgePass run with taps=True: the numbers
    a zero probe on every reader's input gives, from one backward pass that stops at the taps."""
    exact = torch.promote_types(edge_pass.model.dtype, torch.float32)
    grads = torch.autograd.grad(value, [tensor for *_, tensor in edge_pass.taps])
    by_group = {(layer, field): (resid, g) for (layer, field, resid, _), g in zip(edge_pass.taps, grads)}
    columns = []
    for layer in range(edge_pass.graph.n_layers):
        attention, block = edge_pass.model.blocks[layer].attn, edge_pass.model.blocks[layer]
        projected = [torch.einsum("bphe,hde->bphd", by_group[(layer, field)][1].to(exact), weight.to(exact))
                     for field, weight in (("q", attention.W_Q), ("k", attention.W_K), ("v", attention.W_V))]
        columns.append(_norm_adjoint(block.ln_attn, by_group[(layer, "q")][0], torch.cat(projected, 2)))
        resid, g = by_group[(layer, "mlp")]
        columns.append(_norm_adjoint(block.ln_mlp, resid, g.to(exact)[:, :, None]))
    columns.append(by_group[(None, "logits")][1].to(exact)[:, :, None])
    return torch.cat(columns, 2)


def _norm_adjoint(norm, resid: Float[Tensor, "b pos d_model"],
                  u: Float[Tensor, "b pos r d_model"]) -> Float[Tensor, "b pos r d_model"]:
    """u[:, :, r] pulled back through the norm's Jacobian at `resid`, for every r at once: one vector-Jacobian
    product of the norm's own forward, batched over r (in u's dtype)."""
    with torch.enable_grad():
        x = resid.detach().to(u.dtype).requires_grad_(True)
        (g,) = torch.autograd.grad(norm.normalize(x), x, u.movedim(2, 0), is_grads_batched=True)
    return g.movedim(0, 2)

__all__ = ["input_gradients", "tappable"]
