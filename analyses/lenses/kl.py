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

Training a lens runs the loss and its gradient for every site of a chunk of tokens: `kl_and_input_grad` does one
site without autograd (the head's two matmuls in the compute dtype, everything else float32), writing its
[token d_vocab] arrays into a `Scratch` that the sites share. On a CPU a fresh 50 MB tensor per op costs more in
page faults than the op itself (the allocator returns blocks of that size to the system when freed), so reusing
three buffers makes the softmax and the copies several times faster.
"""

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor


class Scratch:
    """[token d_vocab] buffers by name, allocated once and reused (see the module docstring)."""

    def __init__(self) -> None:
        self._buffers: dict[str, Tensor] = {}

    def get(self, name: str, rows: int, like: Tensor, dtype: torch.dtype) -> Tensor:
        """A contiguous [rows like.shape[1]] buffer of `dtype` on like's device (contents undefined)."""
        buffer = self._buffers.get(name)
        if buffer is None or buffer.shape[0] < rows or buffer.shape[1] != like.shape[1] or buffer.dtype != dtype:
            buffer = self._buffers[name] = torch.empty(rows, like.shape[1], dtype=dtype, device=like.device)
        return buffer[:rows]


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
def kl_and_input_grad(
    normalized: Float[Tensor, "token d_model"],
    weight: Float[Tensor, "d_vocab d_model"],
    bias: Float[Tensor, "d_vocab"] | None,
    p: Float[Tensor, "token d_vocab"],
    neg_entropy: Float[Tensor, "token"],
    scratch: Scratch,
) -> tuple[Float[Tensor, "token"], Float[Tensor, "token d_model"]]:
    """KL(p || softmax(normalized @ weight.T + bias)) per token, and its gradient with respect to `normalized`,
    (q - p) @ weight, for a plain linear unembedding (no head, no soft cap). The two matmuls run in weight's dtype
    (bfloat16 as under tuned-lens's autocast: logits and q - p rounded to it); the softmax and KL in float32."""
    logits = scratch.get("logits", len(normalized), p, weight.dtype)
    x = normalized.to(weight.dtype)
    if bias is None:
        torch.mm(x, weight.T, out=logits)
    else:
        torch.addmm(bias, x, weight.T, out=logits)
    z = logits if logits.dtype == torch.float32 else scratch.get("z", len(x), p, torch.float32).copy_(logits)
    dot = _dot(p, z)
    q = torch.softmax(z, -1, out=scratch.get("q", len(x), p, torch.float32))
    # The largest q is exp(0) / sum exp(z - max z), so logsumexp(z) = max z - log max q: two cheap reductions
    # instead of a second exponential pass.
    lse = z.amax(-1) - q.amax(-1).log()
    g = q.sub_(p)
    if weight.dtype != torch.float32:
        g = scratch.get("logits", len(x), p, weight.dtype).copy_(g)  # the logits are no longer needed
    return neg_entropy + lse - dot, torch.mm(g, weight).float()


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
