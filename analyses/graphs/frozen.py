"""The frozen values of one prompt's run: what turns the model into the local replacement model's linear maps.

    values        every block's `frozen_sites()` (resid.components.block) -> its value in the run, batch axis
                  dropped, float32: Site(l, "attn", field="pattern") [head pos key_pos], Site(l, part,
                  field="norm_scale" | "post_norm_scale") [pos 1]; a Mapping (Block.frozen's FrozenValues)
    final_scale   the final norm's scale [pos 1] (what readout.frozen / readout.frozen_adjoint take)
    queries, keys each attention's q [pos head d_head] and k [pos kv_head d_head] as the run's scores read them
                  (q/k-normed, rotated): what a rebuilt pattern is made from

The patterns are the one part of these values that grows with the square of the prompt: stored for every layer
they take n_layers x n_heads x pos^2 x 4 bytes (SmolLM2-135M: 4.5 GB at 2,048 tokens, 18 GB at 4,096), while the
queries and keys they are made from take n_layers x (n_heads + n_kv_heads) x pos x d_head x 4 bytes (57 MB at
4,096). So by default (`Frozen.of(..., store_patterns=False)`) the values keep the queries and keys and rebuild a
layer's pattern when a map reads it (`Rebuilt`: Transformer.attention_pattern, the same scores and softmax as the
run's, over the prompt's masks), one layer at a time: a sweep holds one pattern, not thirty. The rebuilt pattern is
the run's to float32 rounding (bit for bit at the full length), and costs one q k^T per layer and sweep, about
1 / (targets per sweep) of what the sweep's own attention adjoint costs. store_patterns=True keeps the run's
patterns (the values a short prompt could afford, and what the tests compare the rebuilt ones with).

The maps themselves are the components' own (Block.frozen / frozen_adjoint, Attention.frozen, Norm.frozen,
Readout.frozen, Unembed.frozen): this module holds values, not algebra. `truncated(n)` keeps the first n positions,
which is exact under causal attention (a cotangent at positions below n never reaches later ones).
"""

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from torch import Tensor

from resid.capture import Capture
from resid.sites import Site


class Rebuilt(Mapping):
    """Frozen values whose patterns are rebuilt on each read from the run's queries and keys (the module
    docstring); every other value (norm scales, a latent attention's scale) is stored."""

    def __init__(self, model, stored: dict[Site, Tensor], q: dict[Site, Tensor], k: dict[Site, Tensor],
                 token_ids: Tensor):
        # q and k by pattern Site (not `keys`: a Mapping's keys() is its sites)
        self.model, self.stored, self.q, self.k = model, stored, q, k
        self.token_ids = token_ids  # [pos]: the masks and rotary angles of attention_pattern
        self._context = None  # made on the first pattern read, then shared by every layer's

    def __getitem__(self, site: Site) -> Tensor:
        if site in self.stored:
            return self.stored[site]
        q, k = self.q[site], self.k[site]  # a KeyError for a site that is neither
        if self._context is None:
            self._context = self.model.attention_context(self.token_ids[None])
        return self.model.attention_pattern(site.layer, q[None], k[None], self._context)[0].float()

    def __iter__(self) -> Iterator[Site]:
        yield from self.stored
        yield from self.q

    def __len__(self) -> int:
        return len(self.stored) + len(self.q)

    def truncated(self, n_pos: int) -> "Rebuilt":
        """The values of the prompt's first n_pos positions: their queries and keys make the truncated pattern."""
        return Rebuilt(self.model, {site: value[:n_pos] for site, value in self.stored.items()},
                       {site: q[:n_pos] for site, q in self.q.items()},
                       {site: k[:n_pos] for site, k in self.k.items()}, self.token_ids[:n_pos])


@dataclass(frozen=True)
class Frozen:
    values: Mapping[Site, Tensor]  # a dict (store_patterns) or Rebuilt
    final_scale: Tensor  # [pos 1]

    @staticmethod
    def capture(model, store_patterns: bool = False) -> Capture:
        """What a run must record for `of`: every block's frozen sites (patterns as their queries and keys unless
        `store_patterns`), the embeddings and the final norm scale (and nothing else: a sublayer's `out` is not
        needed)."""
        fields: dict[str, set[str]] = {"attn": set(), "mlp": set()}
        for block in model.blocks:
            for site in block.frozen_sites():
                rebuilt = site.what == "pattern" and not store_patterns
                fields[site.part].update(("q", "k") if rebuilt else (site.what,))
        return Capture(attn=fields["attn"], mlp=fields["mlp"], embed=True, final_norm_scale=True)

    @classmethod
    def of(cls, model, run, store_patterns: bool = False) -> "Frozen":
        """The frozen values of the first prompt of `run` (captured with `capture(model, store_patterns)`)."""
        sites = [site for block in model.blocks for site in block.frozen_sites()]
        final_scale = run.stream.final_norm_scale[0].float()
        if store_patterns:
            return cls({site: run.read(site)[0].float() for site in sites}, final_scale)
        patterns = [site for site in sites if site.what == "pattern"]
        # q and k stay in the model's dtype: attention_pattern computes the scores from them as the run did
        queries = {site: run.read(Site(site.layer, "attn", field="q"))[0] for site in patterns}
        keys = {site: run.read(Site(site.layer, "attn", field="k"))[0] for site in patterns}
        stored = {site: run.read(site)[0].float() for site in sites if site.what != "pattern"}
        return cls(Rebuilt(model, stored, queries, keys, run.tokens.ids[0]), final_scale)

    @property
    def n_pos(self) -> int:
        return int(self.final_scale.shape[0])

    def truncated(self, n_pos: int) -> "Frozen":
        """The values at the first n_pos positions (queries and keys of a pattern)."""
        if n_pos == self.n_pos:
            return self
        if isinstance(self.values, Rebuilt):
            return Frozen(self.values.truncated(n_pos), self.final_scale[:n_pos])
        return Frozen({site: value[:, :n_pos, :n_pos] if site.what == "pattern" else value[:n_pos]
                       for site, value in self.values.items()}, self.final_scale[:n_pos])
