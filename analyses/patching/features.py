"""Patching the features of learned dictionaries (resid.dictionaries): which feature sites `sites="feature"`
names, and attribution patching's estimate of each feature's effect.

A feature site is Site(layer, part, feature=i), feature i of the dictionary that reconstructs layers[layer].part.
Patching it puts the donor run's activation of that feature in at every position: inside the dictionary's splice
the site's tensor changes by (a_donor - a_base) * W_dec[i] (the input normalization undone) and by nothing else,
the error term kept (resid.dictionaries.edits). Exact patching does this through the sweep engine's resample
path; attribution patching estimates it to first order:

    effect(feature i) ~ sum over positions p of (a_donor - a_base)[p, i] * d metric / d a[p, i]   at the base run

The gradient is taken through the splice itself: an edit that adds a zero tensor to the activations inside the
pass, so the base run's values are unchanged bit for bit and d metric / d (that tensor) is d metric / d a, for
residual dictionaries and transcoders alike, pre- or post-LN.

    "feature"  every feature of the dictionaries that is active (non-zero) at some real position of either prompt
               of some pair; any other feature has activation zero in both runs, so patching it changes nothing.
Attribution patching gives a row only where a feature's activation differs between the two prompts of the pair
(the estimate of any other is exactly zero).
"""

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from resid.analyses import site_words
from resid.analyses.metrics import metric_values
from resid.analyses.patching.pairs import PromptPairs
from resid.capture import Capture
from resid.dictionaries import Dictionary, Splice, feature_site
from resid.dictionaries.modes import unwrapped
from resid.errors import ResidError, param
from resid.model import Transformer
from resid.sites import Site

WORD = "feature"


def patched_dictionaries(items: Sequence, sites) -> tuple[Dictionary, ...]:
    """The Dictionary values of `dictionaries=` (an Observe / Splice gives its dictionary: patching splices them
    itself); refuses the word "feature" in `sites` without any."""
    found = tuple(unwrapped(items))
    bad = [d for d in found if not isinstance(d, Dictionary)]
    if bad:
        raise ResidError(f"{param('dictionaries')} takes resid.dictionaries.Dictionary values (a cross-layer "
                         f"transcoder is not patched yet), got {type(bad[0]).__name__}.")
    words = [sites] if isinstance(sites, str) else list(sites)
    if WORD in words and not found:
        raise ResidError(f"{param('sites', WORD)} names the features of learned dictionaries: pass them, "
                         "dictionaries=[sae, ...].")
    return found


def require(sites: Sequence[Site], dictionaries: Sequence[Dictionary]) -> None:
    """Feature sites need their dictionaries: refuse them clearly without any."""
    named = [site for site in sites if site.of_dictionary]
    if named and not dictionaries:
        raise ResidError(f"{param('sites')} names features of learned dictionaries ({named[0].label}): pass them, "
                         "dictionaries=[sae, ...].")


def active(model: Transformer, pairs: PromptPairs, dictionaries: Sequence[Dictionary], batch: int) -> list[Site]:
    """The feature sites of `sites="feature"`: those active at some real position of either prompt of some pair,
    in the order of `dictionaries`, then by feature id."""
    seen = {d.name: torch.zeros(d.d_sae, dtype=torch.bool) for d in dictionaries}
    for which in ("clean", "corrupt"):
        n = len(getattr(pairs, which))
        for start in range(0, n, batch):
            tokens = pairs.batch(which, range(start, min(n, start + batch)))
            with torch.no_grad():
                run = model.run(tokens, capture=Capture.none(), logits_at="last", dictionaries=dictionaries)
            mask = run.tokens.attention_mask.bool()
            for d in dictionaries:
                acts = run.dictionaries[d.name].acts
                seen[d.name] |= (acts[mask.to(acts.device)] != 0).any(0).cpu()
    return [feature_site(d, int(i), dictionaries)
            for d in dictionaries for i in seen[d.name].nonzero().flatten().tolist()]


def atp_frame(model: Transformer, pairs: PromptPairs, base: str, chunk: Sequence[int], dictionaries, metric,
              targets: Tensor, baselines: Tensor | None) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """(rows, base metric, donor metric) of one chunk of pairs: one row per (pair, feature whose activation differs
    between its prompts), with the columns of AtP's rows (patched_metric = base metric + estimate)."""
    donor = "clean" if base == "corrupt" else "corrupt"
    base_tokens, donor_tokens = pairs.batch(base, chunk), pairs.batch(donor, chunk)
    with torch.no_grad():
        donor_run = model.run(donor_tokens, capture=Capture.none(), logits_at="last", dictionaries=dictionaries)
    added: dict[str, Tensor] = {}

    def adder(name: str):
        def edit(acts: Tensor, tokens) -> Tensor:
            added[name] = torch.zeros_like(acts, requires_grad=True)
            return acts + added[name]

        return edit

    run = model.run(base_tokens, capture=Capture.none(), logits_at="last", grad=True,
                    dictionaries=[Splice(d, edit=adder(d.name)) for d in dictionaries])
    value = metric_values(metric, run.logits[:, 0], targets, baselines)
    grads = dict(zip(added, torch.autograd.grad(value.sum(), list(added.values()))))
    donor_value = metric_values(metric, donor_run.logits[:, 0], targets, baselines)
    at = pairs.mapping(base, chunk, base_tokens, donor_tokens)
    mask = run.tokens.attention_mask[..., None].to(value.dtype)
    prompts, sites, patched = [], [], []
    value_np = value.detach().double().cpu().numpy()
    for d in dictionaries:
        ours = run.dictionaries[d.name].acts.detach()
        delta = (at.donor_at_base(donor_run.dictionaries[d.name].acts, ours) - ours) * mask.to(ours.device)
        effect = (delta * grads[d.name].to(delta.dtype)).sum(1).double().cpu().numpy()  # [batch feature]
        rows, features = (delta != 0).any(1).cpu().numpy().nonzero()
        for row, feature in zip(rows.tolist(), features.tolist()):
            prompts.append(chunk[row])
            sites.append(feature_site(d, feature, dictionaries))
            patched.append(value_np[row] + effect[row, feature])
    frame = pd.DataFrame({
        "prompt_idx": np.asarray(prompts, dtype=np.int64),
        **site_words.columns(sites),
        "position": pd.array([None] * len(sites), dtype="Int64"),
        "patched_metric": np.asarray(patched, dtype=np.float64),
    })
    frame["magnitude"] = (frame["patched_metric"] - value_np[[chunk.index(p) for p in prompts]]).abs()
    return frame, value_np, donor_value.double().cpu().numpy()
