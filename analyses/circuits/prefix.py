"""The positions a batch of pairs shares: those before the first column where some clean prompt differs from its
corrupt one (ids or padding). There every write of the clean run equals the corrupt run's, so every term of an
edge-patched pass is zero (resid.analyses.circuits.patched) and every run of the pairs (clean, corrupt, any
circuit of them) computes the same keys and values there. Circuit evaluation and exact patching run those positions
once, keep their keys and values (resid.components.kv_cache, as generation does), and run each patched pass over
the remaining positions only: on IOI pairs, whose prompts differ from the second name on, 5 of 14 positions.

Only where the reference is each pair's corrupt run (a mean reference differs everywhere) and the model is a causal
decoder (an encoder-decoder's passes run whole); every prompt's last token is always among the positions run.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from resid import forward
from resid.capture import Capture
from resid.components.attention import allowed_keys
from resid.components.kv_cache import KVCache
from resid.errors import ResidError
from resid.finite import all_finite
from resid.interventions import Intervention, group_edits
from resid.model import Transformer
from resid.selection import Padded
from resid.tokenizer import Tokens


@dataclass(frozen=True)
class SharedPrefix:
    """The first `start` positions of a batch's pairs, run once: every layer's keys (after rotary) and values there,
    [n kv_head start d_head]."""

    start: int
    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]

    @classmethod
    def of(cls, model, clean, corrupt, reference: str = "corrupt") -> "SharedPrefix | None":
        """The prefix the clean and corrupt Tokens share, run; None where there is none to share (no common
        first position, a mean reference, an encoder-decoder's (source, target) sides)."""
        if reference != "corrupt" or isinstance(clean, tuple) or not isinstance(model, Transformer):
            return None
        if not model.config.causal:  # every position reads the later ones
            return None
        if clean.ids.shape != corrupt.ids.shape:
            return None
        same = ((clean.ids == corrupt.ids) & (clean.attention_mask == corrupt.attention_mask)).all(0)
        n_pos = same.shape[0]
        # the first differing column, and no later than any prompt's last real token (the logits read it)
        positions = torch.arange(n_pos, device=same.device)
        first = int(torch.where(same, n_pos, positions).min())
        last = int(torch.where(clean.attention_mask.bool(), positions, -1).max(1).values.min())
        start = min(first, last)
        if start < 1:
            return None
        prefix = _columns(clean, 0, start)
        n = prefix.ids.shape[0]
        cache = KVCache.empty(model.config, n, start, model.dtype, model.device)
        with torch.no_grad():
            forward.forward(model, prefix, {}, Capture.none(), None, ctx=forward.context(model, prefix, cache=cache),
                            logits_at=Padded(torch.zeros(n, 1, dtype=torch.long, device=model.device)), check=False)
        return cls(start, tuple(cache.keys), tuple(cache.values))

    def last_logits(self, model: Transformer, tokens: Tokens, interventions: Sequence[Intervention] = (),
                    circuits: int = 1) -> Float[Tensor, "b d_vocab"]:
        """The last-token logits of `tokens` (a side of the pairs, whole) stacked `circuits` times (rows
        circuit-major), running only the positions after the prefix, with `interventions` (which see those
        positions only)."""
        n, n_pos = tokens.ids.shape
        b, config = circuits * n, model.config
        rest = _columns(tokens, self.start, n_pos, circuits)
        cache = KVCache.empty(config, b, n_pos, model.dtype, model.device)
        for layer in range(config.n_layers):
            cache.keys[layer][:, :, : self.start] = self.keys[layer].repeat(circuits, 1, 1, 1)
            cache.values[layer][:, :, : self.start] = self.values[layer].repeat(circuits, 1, 1, 1)
            cache.filled[layer] = self.start
        mask = tokens.attention_mask
        allowed = {kind: allowed_keys(mask, config.window(kind), config.causal)[:, :, self.start:].repeat(
            circuits, 1, 1, 1) for kind in config.layer_types_used}
        ctx = forward.context(model, rest, cache=cache, allowed=allowed,
                              key_positions=tokens.position_ids.repeat(circuits, 1))
        with torch.no_grad():
            logits = forward.forward(model, rest, group_edits(interventions, config, rest), Capture.none(), None,
                                     ctx=ctx, logits_at="last").logits[:, 0]
        if not all_finite(logits):
            raise ResidError(f"An edge-patched pass of {model.name} produced NaN or infinite logits: load the model "
                             "in float32, or check the prompts' run with model.run (it names the first "
                             "non-finite site).")
        return logits


def _columns(tokens: Tokens, start: int, stop: int, times: int = 1) -> Tokens:
    """Columns start..stop-1 of `tokens`, stacked `times` times."""
    return Tokens(*(t[:, start:stop].repeat(times, 1) for t in (tokens.ids, tokens.attention_mask,
                                                                 tokens.position_ids)))
