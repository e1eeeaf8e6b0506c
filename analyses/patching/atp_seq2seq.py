"""Attribution patching (AtP) of encoder-decoder models (resid.EncoderDecoder): the first-order effect of patching
each write and each head, on the decoder (self-attention, cross-attention, MLP) and on the encoder (sites
"encoder.<label>"), from one run of each side of a pair and one backward pass through both stacks:

    effect(site) ~ sum over the site's positions of (donor value - base value) . d metric / d value

The gradient of an encoder site reaches the metric through every cross-attention that reads the encoded source.
Sites: "sublayer" (each write) and "head" (each head's z); AtP* and the residual and query / key / value / pattern
sites are for decoder-only models. Decoder sites are patched position for position (pairs of equal target
lengths), encoder sites likewise (pairs of equal source lengths; resid.analyses.patching.sources).
"""

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from resid.analyses import site_words
from resid.analyses.metrics import metric_values
from resid.analyses.patching import selection
from resid.analyses.patching.pairs import PairsJob, PromptPairs
from resid.analyses.sweeps import seq2seq
from resid.analyses.sweeps.seq2seq import plain
from resid.capture import Capture
from resid.errors import ResidError, param
from resid.seq2seq import EncoderDecoder
from resid.sites import Site
from resid.tokenizer import Tokens

SITES = ("sublayer", "head")


def chosen(model: EncoderDecoder, sites, method: str, pairs: PromptPairs, width: int, source_width: int) -> list[Site]:
    """The Sites of `sites` (resid.analyses.patching.selection) on both stacks, each a write or a head: the others
    and AtP* are refused, saying what to use."""
    found = {word: seq2seq.expand(model, word, width, source_width) for word in SITES}
    allowed = {site.label for sites_of in found.values() for site in sites_of}

    def refuse(what: str) -> None:
        raise ResidError(f"Attribution patching of an encoder-decoder model takes {param('method', 'atp')} and "
                         f"{param('sites')} of {', '.join(SITES)} (or their Sites); got method={method!r}, {what}. Use "
                         "exact activation patching (patching.activation) for the others.")

    def word(name: str) -> list[Site]:
        if name not in found:
            refuse(f"sites={name!r}")
        return found[name]

    def listed(items: list) -> list[Site]:
        out = seq2seq.expand(model, items, width, source_width)
        for site in out:
            if site.label not in allowed:
                refuse(f"the site {site.label}")
        return out

    if method != "atp":
        refuse(f"sites={sites!r}")
    pairs.require_same_positions("Attribution patching of an encoder-decoder model")
    return selection.expand(sites, word, listed)


@dataclass
class Seq2SeqAtPJob(PairsJob):
    """The AtP rows of chunks of (source, target prefix) pairs."""

    sites: list[Site] = field(default_factory=list)  # every site, both stacks, in table order
    sources: tuple = ()  # (clean sources' token ids, corrupt sources' token ids, pad)

    name = "attribution patching"
    key = ("prompt_idx", "site")

    def signature(self) -> dict:
        return {"analysis": "patching.atp", "sites": [s.label for s in self.sites], "method": "atp",
                "sources": self.sources[:2], **super().signature()}

    def rows(self, model: EncoderDecoder, pairs: PromptPairs, indices: list[int]) -> pd.DataFrame:
        donor = "clean" if self.base == "corrupt" else "corrupt"
        clean_ids, corrupt_ids, pad = self.sources
        ids = {"clean": clean_ids, "corrupt": corrupt_ids}
        source = {side: Tokens.pad([ids[side][i] for i in indices], pad) for side in ids}
        target = {side: pairs.batch(side, indices) for side in ids}
        t = torch.tensor([self.targets[i] for i in indices], device=model.device)
        b = None if self.baselines is None else torch.tensor([self.baselines[i] for i in indices], device=model.device)
        captures = dict(capture=Capture.of(s for s in self.sites if s.stack is None),
                        encoder_capture=Capture.of(plain(s) for s in self.sites if s.stack is not None))
        with torch.no_grad():
            theirs = model.run(source[donor], target[donor], logits_at="last", **captures)
        ours = model.run(source[self.base], target[self.base], logits_at="last", grad=True, **captures)
        value = metric_values(self.metric, ours.logits[:, 0], t, b)
        # a head's z is a slice of its layer's z: the gradient is taken by the whole tensor, then sliced
        wrt = {whole: ours.read(whole) for whole in {_whole(s) for s in self.sites}}
        grads = dict(zip(wrt, torch.autograd.grad(value.sum(), list(wrt.values()), allow_unused=True)))
        masks = {None: ours.tokens.attention_mask, "encoder": ours.encoder.tokens.attention_mask}
        effect = {}
        for site in self.sites:
            whole = _whole(site)
            grad = grads[whole] if grads[whole] is not None else torch.zeros_like(wrt[whole])
            delta = (theirs.read(whole) - wrt[whole]).detach() * grad
            delta = delta if site.head is None else delta[:, :, site.head]
            delta = delta * masks[site.stack].to(delta.dtype).view(*delta.shape[:2], *([1] * (delta.ndim - 2)))
            effect[site] = delta.flatten(1).sum(1).double().cpu().numpy()
        return self._frame(indices, value.detach().double().cpu().numpy(),
                           metric_values(self.metric, theirs.logits[:, 0], t, b).double().cpu().numpy(), effect)

    def _frame(self, indices: list[int], value: np.ndarray, donor_value: np.ndarray, effect: dict) -> pd.DataFrame:
        sites = [site for _ in indices for site in self.sites]
        rows = np.repeat(np.arange(len(indices)), len(self.sites))
        estimate = np.stack([effect[site] for site in self.sites], axis=1).reshape(-1)  # pair-major
        base_metric, donor_metric = value[rows], donor_value[rows]
        return pd.DataFrame({
            "prompt_idx": np.asarray(indices, dtype=np.int64)[rows],
            **site_words.columns(sites),
            "position": pd.array([None] * len(sites), dtype="Int64"),
            "patched_metric": base_metric + estimate,
            "magnitude": np.abs(estimate),
            "clean_metric": donor_metric if self.base == "corrupt" else base_metric,
            "corrupt_metric": base_metric if self.base == "corrupt" else donor_metric,
        })


def _whole(site: Site) -> Site:
    """The tensor a site's gradient is taken by: a write itself, a head's whole z."""
    return dataclasses.replace(site, head=None, field="z") if site.head is not None else site
