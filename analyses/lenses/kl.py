"""KL(final || lens) and the per-token statistics of a lens, in few passes over [token d_vocab].

With p the model's final distribution at a token and z the lens's logits there (q = softmax(z)):

    KL(p || q) = sum p log p - sum p log q = neg_entropy(p) + logsumexp(z) - p . z
    d KL / d z = q - p

so the loss needs one logsumexp and one dot product per token, and its gradient one pass over softmax(z), instead
of autograd through log_softmax, a subtraction, a product and a sum (tuned-lens's `sum(p * (log p -
log_softmax(z)))`, the same value and gradient). Every pass over [token d_vocab] costs about as much as the
unembedding's matmul in bfloat16, so they are counted: softmax and logsumexp are made in place in one float32 copy
of the logits (max, subtract, exp, sum, divide), and dot products are batched matrix-vector products, which write
no [token d_vocab] temporary. Logits may be bfloat16 (an autocast matmul); the arithmetic here is float32.
"""

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor


def _dot(p: Tensor, z: Tensor) -> Tensor:
    """Row-wise p . z as a batched matrix-vector product: one pass, no [token d_vocab] product tensor."""
    return torch.bmm(p[:, None, :], z[:, :, None]).view(-1)


def _softmax_(z: Tensor) -> tuple[Tensor, Tensor]:
    """(softmax(z), logsumexp(z)), computed in place in z (float32): max, subtract, exp, sum, divide, each one
    pass, where torch.logsumexp and torch.softmax would each read z twice and write a new buffer."""
    top = z.amax(-1, keepdim=True)
    total = z.sub_(top).exp_().sum(-1, keepdim=True)
    return z.div_(total), (top + total.log()).view(-1)


def final_distribution(final_logits: Float[Tensor, "token d_vocab"]
                       ) -> tuple[Float[Tensor, "token d_vocab"], Float[Tensor, "token"]]:
    """(p, sum p log p) of the model's logits, float32: sum p log p = p . z - logsumexp(z)."""
    z = final_logits.float()
    p, lse = _softmax_(z.clone())
    return p, _dot(p, z) - lse


class _KLFromFinal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, p, neg_entropy):
        z = logits.float()
        z = z.clone() if z is logits else z  # a float32 copy of our own, worked on in place below
        dot = _dot(p, z)
        q, lse = _softmax_(z)
        ctx.save_for_backward(q, p)
        ctx.dtype = logits.dtype
        return neg_entropy + lse - dot

    @staticmethod
    def backward(ctx, grad):
        q, p = ctx.saved_tensors  # softmax(z) from the forward pass: the gradient is one more pass over it
        return q.sub_(p).mul_(grad[:, None]).to(ctx.dtype), None, None


def kl_from_final(
    logits: Float[Tensor, "token d_vocab"], p: Float[Tensor, "token d_vocab"], neg_entropy: Float[Tensor, "token"]
) -> Float[Tensor, "token"]:
    """KL(p || softmax(logits)) per token, in nats, differentiable in `logits` (gradient: softmax(logits) - p)."""
    return _KLFromFinal.apply(logits, p, neg_entropy)


@torch.no_grad()
def statistics(
    logits: Float[Tensor, "token d_vocab"],
    p: Float[Tensor, "token d_vocab"],
    neg_entropy: Float[Tensor, "token"],
    final_top: Int[Tensor, "token"],
    labels: Int[Tensor, "token"],
    has_label: Bool[Tensor, "token"],
    overwrite: bool = False,
) -> dict[str, Tensor]:
    """Per token: cross-entropy of the next token (labels; NaN where has_label is False), KL(final || lens),
    the lens's entropy, and whether its top token is the model's final top token. overwrite: float32 logits may
    be used as scratch space (the caller has no further use for them), which saves a copy."""
    z = logits.float()
    z = z.clone() if z is logits and not overwrite else z  # worked on in place below
    label_logit = z.gather(1, labels[:, None]).squeeze(1)
    top, dot_p = z.argmax(-1), _dot(p, z)
    high = z.amax(-1, keepdim=True)
    shifted = z.sub_(high)  # t = z - max z
    e = shifted.exp()
    total = e.sum(-1)
    lse = high.view(-1) + total.log()
    ce = lse - label_logit
    return {
        "ce": torch.where(has_label, ce, torch.full_like(ce, float("nan"))),
        "kl": neg_entropy + lse - dot_p,
        "entropy": total.log() - _dot(e, shifted) / total,  # -sum q log q with q = e / total, log q = t - log total
        "top1": (top == final_top).float(),
    }
