"""KL(final || lens) and the per-token statistics of a lens, in few passes over [token d_vocab].

With p the model's final distribution at a token and z the lens's logits there (q = softmax(z)):

    KL(p || q) = sum p log p - sum p log q = neg_entropy(p) + logsumexp(z) - p . z
    d KL / d z = q - p

so the loss needs one logsumexp and one dot product per token, and its gradient one pass, instead of autograd
through log_softmax, a subtraction, a product and a sum (tuned-lens's `sum(p * (log p - log_softmax(z)))`, the
same value and gradient). Logits may be bfloat16 (an autocast matmul); the arithmetic here is float32.
"""

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor


def final_distribution(final_logits: Float[Tensor, "token d_vocab"]
                       ) -> tuple[Float[Tensor, "token d_vocab"], Float[Tensor, "token"]]:
    """(p, sum p log p) of the model's logits, float32."""
    z = final_logits.float()
    lse = torch.logsumexp(z, dim=-1)
    p = torch.softmax(z, dim=-1)
    return p, torch.linalg.vecdot(p, z) - lse


class _KLFromFinal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, p, neg_entropy):
        z = logits.float()
        lse = torch.logsumexp(z, dim=-1)
        ctx.save_for_backward(z, lse, p)
        ctx.dtype, ctx.own = logits.dtype, z is not logits  # own: z is a float32 copy nothing else holds
        return neg_entropy + lse - torch.linalg.vecdot(p, z)

    @staticmethod
    def backward(ctx, grad):
        z, lse, p = ctx.saved_tensors
        # softmax(z) from the forward pass's logsumexp, in place on the float32 copy when there is one (the
        # logits of an autocast matmul are bfloat16): one pass per step, no new [token d_vocab] buffer
        q = (z.sub_(lse[:, None]) if ctx.own else z - lse[:, None]).exp_()
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
) -> dict[str, Tensor]:
    """Per token: cross-entropy of the next token (labels; NaN where has_label is False), KL(final || lens),
    the lens's entropy, and whether its top token is the model's final top token."""
    z = logits.float()
    lse = torch.logsumexp(z, dim=-1)
    q = (z - lse[:, None]).exp_()
    ce = lse - z.gather(1, labels[:, None]).squeeze(1)
    return {
        "ce": torch.where(has_label, ce, torch.full_like(ce, float("nan"))),
        "kl": neg_entropy + lse - torch.linalg.vecdot(p, z),
        "entropy": lse - torch.linalg.vecdot(q, z),
        "top1": (z.argmax(-1) == final_top).float(),
    }
