"""The readout: the one place that turns residual vectors into logits, and logits into directions on the
residual stream. Every analysis goes through it; none touches a norm's internals.

    readout = model.readout
    readout.logits(resid)                    final norm (recomputed) + unembedding: the logit lens
    readout.logits(resid, scale)             the same with the final norm's scale frozen from a run
    readout.frozen(resid, scale)             that final norm alone, float32 (constants on or off); of a
                                             residual given as pieces: frozen_pieces(pieces, scale); and
    readout.frozen_adjoint(u, scale)         its adjoint: u read after the final norm as a read-out before it
    readout.unembed.frozen(normalized)       the logits before any final soft cap, float32 (and frozen_adjoint)
    d = readout.logit_direction(targets, scale, baselines)
    d.project(write)                         what a write adds to logit(target) - logit(baseline)
    d.through(W_O)                           the direction pulled back through a weight: [batch head d_head]

Glossary: a *direction* is a linear read-out of the final residual x at one position of each prompt,
value = x . vector + bias. With the final norm's scale s frozen (stream.final_norm_scale), the norm is affine
(resid.components.norm), so a logit difference is exactly such a read-out:

    u      = W_U[:, target] - W_U[:, baseline]                    (the direction in the unembedding's input)
    vector = s * fold(u)                                          fold = the norm's gain and centering, adjoint
    bias   = b_final . u + b_U[target] - b_U[baseline]

and every write into the stream contributes `write . vector`; the contributions plus the bias sum to the logit.
Any other vector u in the final space (a probe, an embedding difference) is read out the same way
(`direction`). Projections run in float32 whatever the model dtype.

Models without a final norm (BERT ends on its last block's norm) read the final residual as it is (scale 1).
BERT's masked-LM head puts a transform, LN(act(x W + b)), between the final hidden state and the decoder; with
its state frozen at the hidden state of the run (resid.components.head) a logit is again a read-out, exact,
and `direction(..., hidden=...)` pulls u back through it. Embedding models have no unembedding: token logits
raise an error saying to read a direction out instead.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from resid.components.embed import Unembed
from resid.components.head import MLMHead
from resid.components.norm import Norm
from resid.errors import ResidError


@dataclass(frozen=True)
class Direction:
    """value = resid . vector + bias, one row per prompt (float32). The vector is [batch d_model] for a
    read-out at one position, or [batch pos d_model] for one spread over positions (a pooled read-out: the
    value sums every position's product, e.g. mean pooling puts 1/length into each position's vector)."""

    vector: Float[Tensor, "batch *pos d_model"]
    bias: Float[Tensor, "batch"]  # what no write carries: the final norm's bias and b_U, projected

    def project(self, write: Float[Tensor, "batch ... d_model"]) -> Float[Tensor, "batch ..."]:
        """write . vector, row by row: the write's contribution to the value. With a pos axis on the vector,
        `write` has it too ([batch pos *rest d_model]) and the products are summed over it."""
        leading = 2 if self.vector.ndim == 3 else 1
        extra = write.ndim - 1 - leading  # the *rest axes between the vector's axes and d_model
        vector = self.vector.view(*self.vector.shape[:-1], *[1] * extra, self.vector.shape[-1])
        products = torch.linalg.vecdot(write.float(), vector)
        return products.sum(1) if leading == 2 else products

    def through(self, weight: Float[Tensor, "... d_model"]) -> Float[Tensor, "batch ..."]:
        """weight @ vector per row, e.g. W_O [head d_head d_model] -> [batch head d_head], so that a head's
        contribution is z[h] . through(W_O)[h] without building its d_model write ([batch pos *rest] with a
        pos axis on the vector). One matmul over the flattened weight."""
        flat = weight.float().reshape(-1, weight.shape[-1])  # [(rest) d_model]
        return (self.vector @ flat.T).view(*self.vector.shape[:-1], *weight.shape[:-1])

    def before_norm(
        self, norm: Norm, scale: Float[Tensor, "batch *pos 1"]
    ) -> tuple["Direction", Float[Tensor, "batch"]]:
        """This read-out of a norm's output, as a read-out of its input with the norm's scale frozen at `scale`:
        (the direction on the input, the value the norm's bias carries, [batch])."""
        carried = norm.bias_dot(self.vector)
        carried = carried.sum(1) if carried.ndim == 2 else carried
        return Direction(norm.pull_back(self.vector, scale), self.bias), carried


class Readout:
    """Final norm + head: from the final residual to the logits, and back to directions."""

    def __init__(self, norm: Norm | None, unembed: Unembed | None, head: MLMHead | None = None, name: str = "model"):
        self.norm = norm  # None: the model has no final norm (post-LN encoders)
        self._unembed = unembed  # None: an embedding model
        self.head = head  # BERT's MLM transform, or None
        self.name = name

    @property
    def unembed(self) -> Unembed:
        """The unembedding, or an error for embedding models saying what to read out instead."""
        if self._unembed is None:
            raise ResidError(
                f"{self.name} is an embedding model: it has no unembedding, so it has no token logits. Read a "
                "direction out of its final hidden state instead: a Probe(vector) as the target of "
                "resid.analyses.attribution.direct, or resid.analyses.similarity for the similarity of two texts' "
                "embeddings."
            )
        return self._unembed

    def normalize(
        self, resid: Float[Tensor, "*batch d_model"], scale: Float[Tensor, "*batch 1"] | None = None
    ) -> tuple[Float[Tensor, "*batch d_model"], Float[Tensor, "*batch 1"]]:
        """The final norm of `resid` (its scale recomputed, or `scale` frozen) and the scale used (ones for models
        without a final norm, whose final hidden state is the final residual)."""
        if self.norm is None:
            return resid, torch.ones(*resid.shape[:-1], 1, dtype=resid.dtype, device=resid.device)
        return self.norm(resid, scale)

    def logits(
        self, resid: Float[Tensor, "*batch d_model"], scale: Float[Tensor, "*batch 1"] | None = None
    ) -> Float[Tensor, "*batch d_vocab"]:
        """Logits of residual vectors, as if each were the final residual (recomputed or frozen scale)."""
        self.unembed  # noqa: B018 -- an embedding model fails here, before the norm runs
        normalized, _ = self.normalize(resid, scale)
        return self.head_logits(normalized)

    def frozen(
        self, resid: Float[Tensor, "*batch d_model"], scale: Float[Tensor, "*batch 1"], constants: bool = True
    ) -> Float[Tensor, "*batch d_model"]:
        """The final norm with its scale frozen at `scale`, in float32 (with its bias only with `constants`): what
        the unembedding reads in an attribution graph's replacement model; the residual itself without a norm.
        The uncapped logits of its output are `unembed.frozen`."""
        if self.norm is None:
            return resid.float()
        return self.norm.frozen(resid, scale, constants)

    def frozen_pieces(
        self, pieces: Float[Tensor, "piece *batch d_model"], scale: Float[Tensor, "*batch 1"]
    ) -> tuple[Float[Tensor, "piece *batch d_model"], Float[Tensor, "d_model"] | None]:
        """`frozen` of a residual given as pieces that sum to it (a stream's components): each piece through the
        final norm's linear part (scale frozen, float32), and the constant the norm adds once (its bias; None
        where it adds none). They sum to frozen(sum of the pieces, scale): e.g. an encoder's memory, what a
        decoder's cross-attention reads, split by the encoder's components."""
        if self.norm is None:
            return pieces.float(), None
        return self.norm.frozen(pieces, scale, constants=False), self.norm.constant()

    def frozen_adjoint(
        self, u: Float[Tensor, "*batch d_model"], scale: Float[Tensor, "*batch 1"]
    ) -> Float[Tensor, "*batch d_model"]:
        """Reading u after the final norm (scale frozen at `scale`) as a read-out of the final residual: the adjoint
        of `frozen`'s linear part, float32 (the constant it leaves out is the norm's bias_dot(u)); u itself
        without a final norm."""
        if self.norm is None:
            return u.float()
        return self.norm.pull_back(u, scale)

    def head_logits(self, normalized: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch d_vocab"]:
        """Logits of the final norm's output (`logits` without the norm): the head, when there is one, and the
        unembedding. For callers that norm many residuals at once and unembed them a few at a time."""
        unembed = self.unembed
        return unembed(normalized if self.head is None else self.head(normalized))

    @torch.no_grad()
    def token_direction(
        self, targets: Sequence[int] | Int[Tensor, "batch"],
        baselines: Sequence[int] | Int[Tensor, "batch"] | None = None,
    ) -> tuple[Float[Tensor, "batch d_model"], Float[Tensor, "batch"]]:
        """u = W_U[:, t] - W_U[:, b] (the unembedding's input side) and b_U[t] - b_U[b] (zero without b_U)."""
        weight = self.unembed.weight.float()  # [d_vocab d_model]
        b_u = self.unembed.b_U
        t = torch.as_tensor(targets, device=weight.device).long()
        u = weight[t]
        bias = b_u.float()[t] if b_u is not None else torch.zeros(len(t), device=weight.device)
        if baselines is not None:
            b = torch.as_tensor(baselines, device=weight.device).long()
            u = u - weight[b]
            if b_u is not None:
                bias = bias - b_u.float()[b]
        return u, bias

    @torch.no_grad()
    def direction(
        self,
        u: Float[Tensor, "batch d_model"],
        scale: Float[Tensor, "batch 1"],
        bias: Float[Tensor, "batch"] | None = None,
        hidden: Float[Tensor, "batch d_model"] | None = None,
        through_head: bool = False,
    ) -> Direction:
        """The read-out normalized_final . u (+ bias) as a direction on the final residual, exact with the
        final norm's scale frozen at `scale` (one row per prompt). through_head: u is read after an MLM head's
        transform (a token's decoder row), which is frozen at `hidden`, the final hidden state of the run."""
        bias = torch.zeros(u.shape[0], device=u.device) if bias is None else bias.float()
        if through_head and self.head is not None:
            if hidden is None:
                raise ResidError("A direction through the MLM head needs the run's final hidden state (hidden=...).")
            u, head_bias = self.head.pull_back(u, hidden)
            bias = bias + head_bias
        if self.norm is None:
            return Direction(u.float() * scale.float(), bias)
        return Direction(self.frozen_adjoint(u, scale), bias + self.norm.bias_dot(u))

    def logit_direction(
        self,
        targets: Sequence[int] | Int[Tensor, "batch"],
        scale: Float[Tensor, "batch 1"],
        baselines: Sequence[int] | Int[Tensor, "batch"] | None = None,
        hidden: Float[Tensor, "batch d_model"] | None = None,
    ) -> Direction:
        """logit(target) - logit(baseline) == final_resid . vector + bias at a position whose frozen final norm
        scale is `scale` (and, for an MLM head, whose final hidden state is `hidden`)."""
        u, bias = self.token_direction(targets, baselines)
        return self.direction(u, scale, bias, hidden, through_head=True)

    @torch.no_grad()
    def vector_logits(self, vectors: Float[Tensor, "n d_model"],
                      through_norm: bool = True) -> Float[Tensor, "n d_vocab"]:
        """What each vector (a neuron's value, a sub-update) adds to every token's logit: linear(v) @ W_U,
        the final norm's gain and centering applied (through_norm) but not its input-dependent scale, which
        rescales every token alike, nor the biases, which no vector carries. An MLM head's transform depends on
        the input, so these models read vectors with the decoder alone."""
        through_norm = through_norm and self.norm is not None
        vectors = self.norm.linear(vectors) if through_norm else vectors.float()
        return vectors @ self.unembed.W_U.float()

    @torch.no_grad()
    def unembedding(self, through_norm: bool = True) -> Float[Tensor, "d_model d_vocab"]:
        """The matrix U with vector_logits(v) == v @ U: W_U with the final norm's gain and centering folded
        into it (fold is applied to each token's column), for reading many vectors at once."""
        w_u = self.unembed.W_U.float()
        return self.norm.fold(w_u.T).T if through_norm and self.norm is not None else w_u
