"""QK attribution's decomposition (resid.analyses.graphs.qk, whose docstring tells the method): the writes into the
residual a head reads at a position (Terms), each term's part of the head's query or key through the attention's
own frozen maps (Block.frozen_pre, Attention.frozen_qk with Attention.qk_norm_scale and the model's rotary,
Transformer.rotary_of), and a head's score split into pairs of those parts (QK.score, a ScoreAttribution), scored
by the layer's own rule (Attention.score_rule). Validation and summaries are the jobs of validation.py and
summaries.py; QK's methods of those names call them.
"""

import numbers
from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from resid.analyses.graphs.qk import validation
from resid.analyses.graphs.qk.score import ScoreAttribution
from resid.analyses.graphs.qk.summaries import head_rows, summarize
from resid.analyses.graphs.replacement import Replacement, replace
from resid.capture import Capture
from resid.errors import ResidError, param
from resid.heads import head_results
from resid.sites import Site

CAPTURE = Capture(attn={"z", "q_proj", "k_proj", "scores", "pattern", "post_norm_scale", "out"}, mlp={"out"})
HEAD_FIELDS = (None, "scores", "pattern")  # a head Site QK.score explains: the head, its scores or its pattern


@dataclass
class Terms:
    """The residual entering a layer at one position as a sum: sites[i] writes vectors[i]."""

    sites: list[Site]
    vectors: Float[Tensor, "n d_model"]


class QK:
    """QK attribution for one prompt through one set of transcoders (see the module docstring)."""

    @torch.no_grad()
    def __init__(self, model, prompt, transcoders, skip_bos: bool | None = None):
        if model.config.positions == "relative":
            raise ResidError(f"{model.name} adds a relative position bias to its scores: QK attribution covers "
                             "models with rotary, learned or sinusoidal positions.")
        self.model = model
        self.rep: Replacement = replace(model, prompt, transcoders, skip_bos=skip_bos, capture=CAPTURE)
        self.run = self.rep.run
        self.n_pos = self.rep.n_pos
        self._heads: dict[int, Tensor] = {}  # layer -> head writes [head pos d_model]
        self._projected: dict[tuple[str, int, int], tuple[Terms, Tensor]] = {}
        self._blocks: dict[tuple, object] = {}  # the terms' pieces, made once: Sites and writes per layer and position

    # --- the terms ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def terms(self, layer: int, position: int) -> Terms:
        """The writes into the residual entering `layer` at `position` (see the module docstring); they sum to it.
        Assembled from each earlier layer's writes there, made once (`_written`)."""
        found = self.rep.transcoders
        sites, vectors = list(self._embeddings(position).sites), [self._embeddings(position).vectors]
        for l in range(layer):
            block = self._written(l, position)
            sites += block.sites
            vectors.append(block.vectors)
        for source in range(layer):  # each source layer's active features here, their writes below `layer`
            rows, features = self._features(source, position)
            if not len(rows):
                continue
            targets = [t for t in found.targets(source) if t < layer]
            if targets == list(found.targets(source)):  # every write of the feature lands below: made once
                key = ("features", source, position)
                if key not in self._blocks:
                    self._blocks[key] = self._feature_writes(source, rows, targets)
                written = self._blocks[key]
            else:  # a cross-layer transcoder's feature, part of whose writes land at or above `layer`
                written = self._feature_writes(source, rows, targets)
            sites += features
            vectors.append(written)
        return Terms(sites, torch.cat(vectors))

    def _embeddings(self, position: int) -> Terms:
        key = ("embed", position)
        if key not in self._blocks:
            stream, at = self.run.stream, (position,)
            sites, vectors = [Site(None, "embed", positions=at)], [stream.embed[0, position].float()]
            for name in ("pos_embed", "type_embed"):
                extra = getattr(stream, name)
                if extra is not None:
                    sites.append(Site(None, name, positions=at))
                    vectors.append(extra[0, position].float())
            self._blocks[key] = Terms(sites, torch.stack(vectors).to(self.rep.embed.device))
        return self._blocks[key]

    def _written(self, layer: int, position: int) -> Terms:
        """Layer `layer`'s writes at `position` but its features': heads, attention constants, the transcoder's
        error, skip path and b_dec (and position 0's MLP write, with skip_bos)."""
        key = ("layer", layer, position)
        if key in self._blocks:
            return self._blocks[key]
        model, rep, stream = self.model, self.rep, self.run.stream
        found, block, at = rep.transcoders, model.blocks[layer], (position,)
        sites = [Site(layer, "attn", head=h, positions=at) for h in range(model.config.n_heads)]
        vectors = list(self._head_writes(layer)[:, position])
        b_o = block.attn.b_O
        if block.ln_attn_post is not None:
            scale = stream.layers[layer].attn.post_norm_scale[0, position].float()
            if b_o is not None:
                sites.append(Site(layer, "attn", field="b_O", positions=at))
                vectors.append(block.ln_attn_post.frozen(b_o.float(), scale, constants=False))
            bias = block.ln_attn_post.constant()
            if bias is not None:
                sites.append(Site(layer, "attn", field="post_norm_bias", positions=at))
                vectors.append(bias)
        elif b_o is not None:
            sites.append(Site(layer, "attn", field="b_O", positions=at))
            vectors.append(b_o.float())
        sites.append(Site(layer, "mlp", field="error", positions=at))
        vectors.append(rep.errors[layer, position])
        skip = found.skip(layer)
        if skip is not None:
            sites.append(Site(layer, "mlp", field="skip", positions=at))
            vectors.append(rep.inputs[layer][position].float() @ skip)
        sites.append(Site(layer, "mlp", field="b_dec", positions=at))
        vectors.append(found.b_dec(layer))
        if rep.skip_bos and position == 0:
            sites.append(Site(layer, "mlp", positions=at))
            vectors.append(rep.fixed[layer, 0])
        device = rep.embed.device
        self._blocks[key] = Terms(sites, torch.stack([v.to(device) for v in vectors]))
        return self._blocks[key]

    def _features(self, source: int, position: int) -> tuple[Tensor, list[Site]]:
        """The rows of rep.features of `source`'s active features at `position`, and their Sites."""
        key = ("rows", source, position)
        if key not in self._blocks:
            rep = self.rep
            rows = ((rep.features[:, 1] == position) & (rep.features[:, 0] == source)).nonzero().flatten()
            sites = [Site(source, "mlp", feature=f, positions=(position,)) for f in rep.features[rows, 2].tolist()]
            self._blocks[key] = (rows, sites)
        return self._blocks[key]

    def _feature_writes(self, source: int, rows: Tensor, targets: list[int]) -> Tensor:
        """a * W_dec of the features at `rows` summed over the layers `targets` they write into [n d_model]."""
        found, device = self.rep.transcoders, self.rep.embed.device
        features = self.rep.features[rows, 2]
        written = sum(found.decoder(source, t, features) for t in targets)
        return written.to(device) * self.rep.activations[rows, None].to(device)

    def _head_writes(self, layer: int) -> Tensor:
        if layer not in self._heads:
            self._heads[layer] = head_results(self.run, self.model, layers=[layer])[1][:, 0].float()
        return self._heads[layer]

    @torch.no_grad()
    def projected(self, side: str, layer: int, position: int) -> tuple[Terms, Tensor]:
        """(the terms at `position`, each one's query (side "q", [n+1 head d_head]) or key ("k", [n+1 kv_head
        d_head]) at `layer`): the linear map of each term, then one last row, the map's constant (b_Q / b_K)."""
        key = (side, layer, position)
        if key not in self._projected:
            terms = self.terms(layer, position)
            block = self.model.blocks[layer]
            frozen = self.rep.frozen.values
            n = len(terms.sites)
            positions = torch.full((n + 1,), position)
            rows = torch.cat([terms.vectors, torch.zeros(1, terms.vectors.shape[-1], device=terms.vectors.device)])
            linear = block.frozen_pre("attn", rows[:n], frozen, constants=False, positions=positions[:n])
            constant = block.frozen_pre("attn", rows[n:], frozen, constants=True, positions=positions[n:])
            norm_scale = self._qk_norm_scale(side, layer, position)
            cos, sin = self._angles(layer, position)
            parts = [block.attn.frozen_qk(side, linear, _rows(norm_scale, n), _rows(cos, n), _rows(sin, n),
                                          constants=False),
                     block.attn.frozen_qk(side, constant, _rows(norm_scale, 1), _rows(cos, 1), _rows(sin, 1))]
            field = "b_Q" if side == "q" else "b_K"
            sites = [*terms.sites, Site(layer, "attn", field=field, positions=(position,))]
            self._projected[key] = (Terms(sites, terms.vectors), torch.cat(parts))
        return self._projected[key]

    def _qk_norm_scale(self, side: str, layer: int, position: int) -> Tensor | None:
        """The q/k norm's scale at `position` as frozen_qk takes it, from the run's projected queries or keys."""
        record = self.run.stream.layers[layer].attn
        projected = (record.q_proj if side == "q" else record.k_proj)[0, position:position + 1].float()
        return self.model.blocks[layer].attn.qk_norm_scale(side, projected)

    def _angles(self, layer: int, position: int) -> tuple[Tensor | None, Tensor | None]:
        """The rotary (cos, sin) [1 1 rot] of `position` at `layer` (the model's rotary for the layer's type; none
        on a layer that does not rotate, e.g. SmolLM3's NoPE layers)."""
        attn = self.model.blocks[layer].attn
        rotary = self.model.rotary_of(attn.layer_type)
        if rotary is None or not attn.rotates:
            return None, None
        cos, sin = rotary.cos_sin(torch.tensor([[position]], device=self.rep.embed.device), torch.float32)
        return cos[0], sin[0]

    def forget(self, layer: int) -> None:
        """Let go of `layer`'s projected terms (QK.heads walks the layers one by one, holding one layer's)."""
        self._projected = {key: value for key, value in self._projected.items() if key[1] != layer}

    # --- scores -------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def score(self, site: Site | int, head: int | None = None, query: int | None = None, key: int | None = None,
              versus: int | str | None = None) -> ScoreAttribution:
        """A head's score at position `query` (negative: from the end; default the last) and key `key` (None: the
        key it attends to most) split into pairs; `versus` a position k' (score(q, key) - score(q, k')) or "mean"
        (score(q, key) minus the pattern-weighted mean of its scores over every key). The head is a Site
        (Site(L, "attn", head=H), its one position the query: Site(L, "attn", head=H, positions=(q,))) or, as a
        shorthand, a layer and a head: score(L, H, query=q)."""
        layer, head, query = self._head(site, head, query)
        query = self._position(query, "query")
        attn = self.model.blocks[layer].attn
        rule = attn.score_rule
        record = self.run.stream.layers[layer].attn
        scores = record.scores[0, head, query].float()
        pattern = record.pattern[0, head, query].float()
        if key is None:
            key = int(pattern.argmax())
        key = self._position(key, "key")
        weights = {key: 1.0}
        if versus == "mean":
            for k in range(query + 1):
                if torch.isfinite(scores[k]) and float(pattern[k]) != 0:
                    weights[k] = weights.get(k, 0.0) - float(pattern[k])
        elif versus is not None:
            if isinstance(versus, str):
                raise ResidError(f"{param('versus', versus)} is a key position or 'mean'.")
            versus = self._position(versus, "versus")
            if versus == key:
                raise ResidError(f"versus={versus} is the key itself: the contrast would be zero. Give another key.")
            weights[versus] = -1.0
        for k in weights:
            if not bool(torch.isfinite(scores[k])):
                window = " within its window" if attn.layer_type == "sliding" else ""
                raise ResidError(f"Head {Site(layer, 'attn', head=head).label} at position {query} cannot read "
                                 f"position {k} (causal mask or sliding window): give a key it reads, 0 to "
                                 f"{query}{window}.")
        q_terms, q_vectors = self.projected("q", layer, query)
        kv = rule.kv_head(head)
        key_sites, key_parts = [], []
        for k, w in weights.items():
            k_terms, k_vectors = self.projected("k", layer, k)
            key_sites += k_terms.sites
            key_parts.append(k_vectors[:, kv] * w)
        raw = rule.uncapped(scores)
        run_raw = float(sum(w * raw[k] for k, w in weights.items()))
        return ScoreAttribution(layer, head, query, weights, q_terms.sites, key_sites, q_vectors[:, head],
                                torch.cat(key_parts), rule, run_raw, {k: float(scores[k]) for k in weights},
                                {k: float(pattern[k]) for k in weights})

    def heads(self, query: int = -1, versus: int | str | None = None, layers: Iterable[int] | None = None
              ) -> pd.DataFrame:
        """Every head of `layers` (None: all) at `query`, its strongest pair and terms (summaries.head_rows)."""
        return head_rows(self, query, versus, layers)

    def summaries(self, triples: Iterable[tuple[Site, int]], top: int = 6) -> dict[str, dict]:
        """What a graph viewer shows for each (head Site at a query, key) in `triples` (summaries.summarize)."""
        return summarize(self, triples, top)

    def validate(self, result: ScoreAttribution, top: int = 5) -> pd.DataFrame:
        """The `top` terms of each side removed in the real model, measured beside predicted (validation.validate)."""
        return validation.validate(self, result, top)

    def _head(self, site: Site | int, head: int | None, query: int | None) -> tuple[int, int, int]:
        """(layer, head, query) of score's head, checked: a head Site of self-attention, or a layer and a head."""
        config = self.model.config
        if isinstance(site, Site):
            if site.part != "attn" or site.head is None or site.field not in HEAD_FIELDS or site.stack is not None:
                raise ResidError(f"{site.label} is not an attention head: QK.score explains a head of self-attention, "
                                 "Site(L, 'attn', head=H) (its one position the query), or score(L, H).")
            if head is not None:
                raise ResidError(f"score({site.label}, head={head}): the Site names the head already; give one of "
                                 "the two.")
            if site.positions is not None and (len(site.positions) != 1 or query is not None):
                raise ResidError(f"score({site.label}{'' if query is None else f', query={query}'}): a head Site "
                                 "gives one query position, or none and query= gives it.")
            resolved = site.resolve(config)
            return resolved.layer, resolved.head, query if site.positions is None else site.positions[0]
        _whole(site, "layer")
        if head is None:
            raise ResidError(f"score({site}) needs the head: score(Site({site}, 'attn', head=H)) or score({site}, H).")
        _whole(head, "head")
        layer = Site(site, "attn").resolve(config).layer
        if not -config.n_heads <= int(head) < config.n_heads:
            raise ResidError(f"{param('head', head)}: layer {layer} has {config.n_heads} heads (0 to "
                             f"{config.n_heads - 1}).")
        return layer, int(head) % config.n_heads, -1 if query is None else query

    def _position(self, position: int, name: str) -> int:
        _whole(position, name)
        if not -self.n_pos <= int(position) < self.n_pos:
            raise ResidError(f"{param(name, position)} is outside the prompt's {self.n_pos} positions (0 to "
                             f"{self.n_pos - 1}, or negative from the end).")
        return int(position) % self.n_pos


def _rows(value: Tensor | None, n: int) -> Tensor | None:
    """One position's frozen value [1 ...] repeated for n rows."""
    return None if value is None else value.expand(n, *value.shape[1:])


def _whole(value: object, name: str) -> None:
    """Refuse a position or head that is not a whole number: int(1.5) and int(True) would read as 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ResidError(f"{param(name, value)} must be a whole number (an int; negative counts from the end), not "
                         f"{type(value).__name__}: int() would read {value!r} as another position or head.")
