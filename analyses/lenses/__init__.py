"""Lenses that read the residual stream at every site as a next-token distribution.

    lens          Lens, LogitLens, TunedLens: small classes over the model's readout (final norm + unembedding)
    translators   Translators: a tuned lens's per-site affine maps T(h) = h + h @ A.T + b at residual sites (resid.Site)
    formats       read / write a tuned lens: resid's safetensors layout, tuned-lens's config.json + params.pt
    data          a corpus as packed token windows, held-out paragraphs, the training order
    kl            KL(final || lens) with its gradient in one pass, and the per-token statistics of a lens
    training      the training (tuned-lens's recipe), a step job of resid's step driver: resumable, Ray-able
    evaluation    both lenses per layer on held-out text: cross-entropy, KL, entropy, top-1 agreement (a reduction
                  of resid's driver)
    plots         the evaluation as a figure

resid.analyses.tuned_lens gathers what a user calls (train, evaluate, read, write); resid.analyses.logit_lens.run
takes either lens (`lens=`).
"""

from resid.analyses.lenses.lens import Lens, LogitLens, TunedLens
from resid.analyses.lenses.translators import Translators

__all__ = ["Lens", "LogitLens", "Translators", "TunedLens"]
