"""The tuned lens (Belrose et al. 2023, "Eliciting Latent Predictions from Transformers with the Tuned Lens"): train
one on a corpus, write and read it (resid's layout or tuned-lens's), evaluate it against the logit lens site by
site, and read prompts through it with resid.analyses.logit_lens.run(..., lens=lens).

    from resid.analyses import corpus, logit_lens, tuned_lens
    training, held_out = tuned_lens.split(corpus.demo())            # paragraphs held out by a hash of their text
    recipe = tuned_lens.Recipe(steps=48, tokens_per_step=1024, seq_len=512)   # tuned-lens's recipe, a CPU budget
    lens = tuned_lens.train(model, training, recipe, Execution(out="lens"))  # resumable: rerun to continue
    tuned_lens.write(lens, "lens")                 # lens/translators.safetensors; layout="tuned-lens": config.json
                                                   # + params.pt, readable by tuned-lens's TunedLens
    lens = tuned_lens.read(model, "lens")          # either layout (params.pt via torch.load(weights_only=True))
    df = tuned_lens.evaluate(model, held_out, [lens], max_tokens=8192)   # ce, kl, entropy, top1 per lens and site
    # both run through resid's driver: execution=Execution(batch_size=..., executor="ray", workers=2, progress=...)
    tuned_lens.figure(df)
    logit_lens.run(model, prompt, lens=lens)       # every lens table, plot and `resid lens` command takes it

The pieces live in resid.analyses.lenses (the recipe followed is stated in resid.analyses.lenses.training).
"""

from resid.analyses.lenses.data import pack, split
from resid.analyses.lenses.evaluation import evaluate
from resid.analyses.lenses.formats import read, unembed_hash, write
from resid.analyses.lenses.lens import LogitLens, TunedLens
from resid.analyses.lenses.plots import evaluation as figure
from resid.analyses.lenses.training import Recipe, loss_and_gradients, train
from resid.analyses.lenses.translators import Translators
from resid.analyses.logit_lens import site_list
from resid.model import Transformer

__all__ = ["LogitLens", "Recipe", "Translators", "TunedLens", "evaluate", "figure", "loss_and_gradients", "pack",
           "read", "split", "train", "unembed_hash", "write", "zeros"]


def zeros(model: Transformer, every: str = "layer", bias: bool = True) -> TunedLens:
    """A tuned lens whose translators are all zero: the logit lens, exactly (a start for training, or a test)."""
    translators = Translators.zeros(site_list(model, every)[:-1], model.config.d_model, every, bias,
                                    {"model": model.name})
    return TunedLens(model, translators)
