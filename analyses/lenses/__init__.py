"""Lenses: read the residual stream at every site as a next-token distribution. One idea, one home: a lens maps
the residual at a site to a residual that the model's one readout (final norm + unembedding) reads.

    lens          Lens and its kinds, LogitLens (identity), TunedLens (affine per site), JacobianLens (linear per
                  site: the expected Jacobian); the sites a lens reads (site_list, short_label)
    predictions   a lens's top tokens, target rank, entropy and KL per site at prompts (`resid.analyses.logit_lens`)
    translators   Translators: a tuned lens's per-site affine maps T(h) = h + h @ A.T + b at residual sites (resid.Site)
    jacobian      fitting a J-lens: the expected Jacobian of the final residual over a corpus (a job of the driver)
    formats       read / write lenses: resid's safetensors layouts, tuned-lens's config.json + params.pt,
                  TransformerLens's J-lens files
    data          a corpus as packed token windows, held-out paragraphs, the training order
    kl            KL(final || lens) with its gradient in one pass, and the per-token statistics of a lens
    training      the tuned lens's training (tuned-lens's recipe), a step job of resid's step driver
    evaluation    lenses per site on held-out text: cross-entropy, KL, entropy, top-1 agreement (a reduction of
                  resid's driver)
    interventions steering, ablating and patching in a lens's coordinates, as edits of the one forward
    plots         the evaluation as a figure

What a user calls is reachable from here (`from resid.analyses import tuned_lens` is this package, and
`from resid.analyses import logit_lens` its predictions module):

    from resid.analyses import corpus, lenses
    training, held_out = lenses.split(corpus.demo())
    tuned = lenses.train(model, training, lenses.Recipe(steps=48, tokens_per_step=1024, seq_len=512))
    jlens = lenses.fit_jacobian(model, training, max_windows=64)      # resumable with Execution(out=...)
    lenses.write(jlens, "jlens"); jlens = lenses.read(model, "jlens")   # any lens's folder, any layout
    df = lenses.evaluate(model, held_out, [tuned, jlens])                # ce, kl, entropy, top1 per lens and site
    lenses.figure(df)
    lenses.run(model, prompt, lens=jlens)                               # per-site predictions at a prompt

Names are loaded on first use, so that importing one module (a Ray worker's) does not import them all.
"""

import importlib

_WHERE = {
    "Lens": "lens", "LogitLens": "lens", "TunedLens": "lens", "JacobianLens": "lens", "site_list": "lens",
    "short_label": "lens", "zeros": "lens",
    "run": "predictions", "COLUMNS": "predictions",
    "Translators": "translators",
    "fit_jacobian": "jacobian",
    "read": "formats", "write": "formats", "unembed_hash": "formats",
    "pack": "data", "split": "data",
    "Recipe": "training", "train": "training", "loss_and_gradients": "training",
    "evaluate": "evaluation",
    "figure": "plots",
}
_RENAMED = {"figure": "evaluation"}  # public name -> the module's own


def __getattr__(name: str):
    if name in _WHERE:
        module = importlib.import_module(f"resid.analyses.lenses.{_WHERE[name]}")
        return getattr(module, _RENAMED.get(name, name))
    raise AttributeError(f"module 'resid.analyses.lenses' has no attribute {name!r}")


__all__ = sorted(_WHERE)
