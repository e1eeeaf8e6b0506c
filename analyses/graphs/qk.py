"""QK attribution: why a head attended where it did, in the terms of an attribution graph (Kamath, Ameisen et al.
2025, "Tracing attention computation through feature interactions").

With the scales of the attention's pre-norm and q/k norms frozen at the run's and the rotary angles fixed by the
positions, a head's query at position q is affine in the residual entering its layer there, and its key at k in
the residual at k: the pre-softmax score q . k * scale is a bilinear form in the two residuals. Each residual is a
sum of terms, the writes into it at that position, in the run with every MLP spliced by its transcoder (error
kept: the model's own run):

    embed@p, pos_embed@p                the embedding writes
    layers[l].attn.head[h]@p            each earlier head's write there (z[h] @ W_O[h], through a post-norm's
                                        frozen scale): what attention moved to p (the graph's edges say from where)
    layers[l].mlp.feature[f]@p          each active transcoder feature's write, a * W_dec (a cross-layer
                                        transcoder's into every layer below): the graph's feature nodes
    layers[l].mlp.error@p | .skip@p     the transcoder's error (a graph node) and skip path x @ W_skip
    layers[l].attn.b_O@p | post_norm_bias@p | layers[l].mlp.b_dec@p | layers[l].mlp@0   the constants: output
                                        biases, post-norm biases, decoder biases, position 0's MLP writes where
                                        skip_bos makes them constants (as in the graph)
    layers[L].attn.b_Q@q | b_K@k        the query's (key's) own constant: the pre-norm's bias through W_Q, plus b_Q

so the score is a sum over pairs (query-side term, key-side term), exact to float rounding: tests/graphs compare the
pairs' sum with the run's own scores on every family resid loads.

    qk = graphs.QK(model, prompt, transcoders)            # one spliced run, kept
    result = qk.score(5, 3, query=-1, key=4)               # a ScoreAttribution: layer 5, head 3
    result.top(10); result.query_marginal(); result.key_marginal()
    qk.score(5, 3, query=-1, key=4, versus=2)              # score(q, 4) - score(q, 2): why 4 rather than 2
    qk.score(5, 3, query=-1, key=4, versus="mean")         # score(q, 4) minus the pattern-weighted mean score
    qk.validate(result, top=5)                             # remove terms in the real model: measured vs predicted

A contrast weighs keys (1 at `key`, -1 at `versus`, or -pattern[q, k'] at every key k' with "mean"); the key-side
terms of each weighted key appear scaled by its weight, and the pairs sum to the weighted sum of raw scores. Raw:
before a soft cap (Gemma 2's score is cap * tanh(raw / cap), increasing in raw).

    query_marginal()[i] = scale * Q_i . sum_j K_j     how much query-side term i raises the (contrasted) score:
                                                      which features make the head look
    key_marginal()[j]   = scale * sum_i Q_i . K_j     which terms make a key attractive

Cost: each term's query (key) is one [d_model] x [d_model d_head] product per head, cached per layer and position;
the pairs of one score are n_q x n_k x d_head multiply-adds, and `top` finds the largest block by block, so memory
stays linear in the terms (the full pair matrix exists only when `pairs()` is asked for).
"""

import numbers
from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from resid.analyses.graphs.replacement import Replacement, replace
from resid.capture import Capture
from resid.errors import ResidError, param
from resid.heads import head_results
from resid.interventions import Add
from resid.sites import Site

CAPTURE = Capture(attn={"z", "q_proj", "k_proj", "scores", "pattern", "post_norm_scale", "out"}, mlp={"out"})
PAIR_BLOCK = 1 << 22  # pairs scored at once by `top`: bounds its memory whatever the number of terms


@dataclass
class Terms:
    """The residual entering a layer at one position as a sum: sites[i] writes vectors[i]."""

    sites: list[Site]
    vectors: Float[Tensor, "n d_model"]


@dataclass
class ScoreAttribution:
    """One head's (contrasted) score at one query, split into pairs of terms: scale * Q[i] . K[j] sums to `raw`."""

    layer: int
    head: int
    query: int
    weights: dict[int, float]  # key position -> its weight in the contrast
    query_sites: list[Site]
    key_sites: list[Site]
    Q: Float[Tensor, "n_q d_head"]  # each query-side term's part of the head's query
    K: Float[Tensor, "n_k d_head"]  # each key-side term's part of its key, times the key's weight
    scale: float
    run_raw: float  # the weighted raw scores of the run itself (what `raw` must equal)
    run_scores: dict[int, float]  # the run's (capped) score at each weighted key
    pattern: dict[int, float]  # the run's pattern at each weighted key

    @property
    def head_site(self) -> Site:
        return Site(self.layer, "attn", head=self.head, positions=(self.query,))

    @property
    def raw(self) -> float:
        """The sum of every pair: the weighted raw score of the frozen bilinear form."""
        return float(self.scale * (self.Q.double().sum(0) @ self.K.double().sum(0)))

    def pairs(self) -> Float[Tensor, "n_q n_k"]:
        """Every pair's part, [n_q n_k] (memory n_q * n_k: prefer `top` for contrasts over every key)."""
        return self.scale * self.Q @ self.K.T

    def query_marginal(self, n: int | None = None) -> pd.DataFrame:
        """Each query-side term's part summed over the key side, largest magnitude first (the first n: None all)."""
        return _marginal(self.query_sites, self.scale * self.Q @ self.K.sum(0), n)

    def key_marginal(self, n: int | None = None) -> pd.DataFrame:
        """Each key-side term's part summed over the query side, largest magnitude first (the first n: None all)."""
        return _marginal(self.key_sites, self.scale * self.K @ self.Q.sum(0), n)

    def top(self, n: int = 10) -> pd.DataFrame:
        """The n pairs of largest magnitude: query (site label), key (site label), value, found block by block."""
        if n < 1:
            raise ResidError(f"{param('n', n)} must be at least 1.")
        values, rows, cols = self._top(n)
        return pd.DataFrame({"query": [self.query_sites[r].label for r in rows.tolist()],
                             "key": [self.key_sites[c].label for c in cols.tolist()],
                             "value": values.double().cpu().numpy()})

    def _top(self, n: int) -> tuple[Tensor, Tensor, Tensor]:
        """(values, query rows, key rows) of the n largest pairs, scanning blocks of PAIR_BLOCK pairs."""
        best_values = torch.zeros(0, device=self.Q.device)
        best_index = torch.zeros(0, dtype=torch.long, device=self.Q.device)
        width = len(self.key_sites)
        step = max(1, PAIR_BLOCK // max(width, 1))
        for start in range(0, len(self.query_sites), step):
            block = (self.scale * self.Q[start:start + step] @ self.K.T).flatten()
            if n == 1 and not len(best_values):  # the largest alone: an argmax, no sort
                best = block.abs().argmax()
                best_values, best_index = block[best][None], (best + start * width)[None]
                continue
            values = torch.cat([best_values, block])
            index = torch.cat([best_index, torch.arange(len(block), device=block.device) + start * width])
            keep = values.abs().topk(min(n, len(values))).indices
            best_values, best_index = values[keep], index[keep]
        return best_values, best_index // width, best_index % width

    def __repr__(self) -> str:
        keys = ", ".join(f"{w:+.3g}*k{p}" for p, w in list(self.weights.items())[:4])
        more = ", ..." if len(self.weights) > 4 else ""
        return (f"ScoreAttribution({self.head_site.label} vs [{keys}{more}]: raw {self.raw:.4g} from "
                f"{len(self.query_sites)} x {len(self.key_sites)} terms)")


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
        """The q/k norm's scale at `position` [1 heads 1] (or [1 1 1] over the whole projection), from the run."""
        attn = self.model.blocks[layer].attn
        norm = attn.q_norm if side == "q" else attn.k_norm
        if norm is None:
            return None
        record = self.run.stream.layers[layer].attn
        projected = (record.q_proj if side == "q" else record.k_proj)[0, position:position + 1].float()
        if attn.qk_norm == "all":
            return norm(projected.flatten(-2))[1][:, None]
        return norm(projected)[1]

    def _angles(self, layer: int, position: int) -> tuple[Tensor | None, Tensor | None]:
        """The rotary (cos, sin) [1 1 rot] of `position` at `layer` (its local rotary on sliding layers)."""
        model = self.model
        if model.rotary is None or not model.blocks[layer].attn.rotates:  # NoPE layers rotate nothing
            return None, None
        local = model.rotary_local is not None and model.blocks[layer].attn.layer_type == "sliding"
        rotary = model.rotary_local if local else model.rotary
        cos, sin = rotary.cos_sin(torch.tensor([[position]], device=self.rep.embed.device), torch.float32)
        return cos[0], sin[0]

    # --- scores -------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def score(self, layer: int, head: int, query: int = -1, key: int | None = None,
              versus: int | str | None = None) -> ScoreAttribution:
        """Head `head` of `layer` at position `query` (negative: from the end): its score at `key` (None: the key
        it attends to most) split into pairs; `versus` a position k' (score(q, key) - score(q, k')) or "mean"
        (score(q, key) minus the pattern-weighted mean of its scores over every key)."""
        config = self.model.config
        layer = Site(layer, "attn").resolve(config).layer
        _whole(head, "head")
        if not -config.n_heads <= int(head) < config.n_heads:
            raise ResidError(f"{param('head', head)}: layer {layer} has {config.n_heads} heads (0 to "
                             f"{config.n_heads - 1}).")
        head = int(head) % config.n_heads
        query = self._position(query, "query")
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
        attn = self.model.blocks[layer].attn
        for k in weights:
            if not bool(torch.isfinite(scores[k])):
                window = " within its window" if attn.layer_type == "sliding" else ""
                raise ResidError(f"Head {Site(layer, 'attn', head=head).label} at position {query} cannot read "
                                 f"position {k} (causal mask or sliding window): give a key it reads, 0 to "
                                 f"{query}{window}.")
        q_terms, q_vectors = self.projected("q", layer, query)
        q = q_vectors[:, head]
        kv = head // (attn.n_heads // attn.n_kv_heads)
        key_sites, key_parts = [], []
        for k, w in weights.items():
            k_terms, k_vectors = self.projected("k", layer, k)
            key_sites += k_terms.sites
            key_parts.append(k_vectors[:, kv] * w)
        raw = _uncapped(scores, attn.softcap)
        run_raw = float(sum(w * raw[k] for k, w in weights.items()))
        return ScoreAttribution(layer, head, query, weights, q_terms.sites, key_sites, q, torch.cat(key_parts),
                                float(attn.scale), run_raw, {k: float(scores[k]) for k in weights},
                                {k: float(pattern[k]) for k in weights})

    @torch.no_grad()
    def heads(self, query: int = -1, versus: int | str | None = None, layers=None) -> pd.DataFrame:
        """Every head of `layers` (None: all) at position `query`: its score at the key it attends to most (or its
        contrast `versus`, as in `score`), with the strongest query-side term, key-side term and pair. One row per
        head: head (site), key, pattern, score, raw, query_term, query_value, key_term, key_value, pair_query,
        pair_key, pair_value. Layer by layer, so memory holds one layer's projected terms."""
        config = self.model.config
        layers = range(config.n_layers) if layers is None else [Site(l, "attn").resolve(config).layer for l in layers]
        rows = []
        for layer in layers:
            for head in range(config.n_heads):
                result = self.score(layer, head, query=query, versus=versus)
                key = next(iter(result.weights))
                q_side = result.scale * result.Q @ result.K.sum(0)
                k_side = result.scale * result.K @ result.Q.sum(0)
                i, j = int(q_side.abs().argmax()), int(k_side.abs().argmax())
                value, row, col = result._top(1)
                rows.append({"head": result.head_site.label, "key": key, "pattern": result.pattern[key],
                             "score": result.run_scores[key], "raw": result.raw,
                             "query_term": result.query_sites[i].label, "query_value": float(q_side[i]),
                             "key_term": result.key_sites[j].label, "key_value": float(k_side[j]),
                             "pair_query": result.query_sites[int(row[0])].label,
                             "pair_key": result.key_sites[int(col[0])].label, "pair_value": float(value[0])})
            self._projected = {k: v for k, v in self._projected.items() if k[1] != layer}
        return pd.DataFrame(rows)

    @torch.no_grad()
    def summaries(self, triples, top: int = 6) -> dict[str, dict]:
        """For each (head Site at a query position, key position) in `triples`: the score, the pattern, its top
        pairs and terms, and the contrast with the pattern-weighted mean (what a viewer shows for a head that
        carries an edge). Keyed "<head site>-><key>", e.g. "layers[3].attn.head[5]@7->2"; plain JSON values."""
        out = {}
        for site, key in triples:
            name = f"{site.label}->{int(key)}"
            if name in out:
                continue
            entry = {}
            for versus in (None, "mean"):
                result = self.score(site.layer, site.head, query=site.positions[0], key=int(key), versus=versus)
                queries, keys = result.query_marginal(top), result.key_marginal(top)
                part = {"raw": result.raw, "run_raw": result.run_raw,
                        "pairs": [[r.query, r.key, float(r.value)] for r in result.top(top).itertuples()],
                        "query_terms": [[r.site, float(r.value)] for r in queries.itertuples()],
                        "key_terms": [[r.site, float(r.value)] for r in keys.itertuples()]}
                if versus is None:
                    entry.update(score=result.run_scores[int(key)], pattern=result.pattern[int(key)], **part)
                else:
                    entry["versus_mean"] = part
            out[name] = entry
        return out

    def _position(self, position: int, name: str) -> int:
        _whole(position, name)
        if not -self.n_pos <= int(position) < self.n_pos:
            raise ResidError(f"{param(name, position)} is outside the prompt's {self.n_pos} positions (0 to "
                             f"{self.n_pos - 1}, or negative from the end).")
        return int(position) % self.n_pos

    # --- validation on the real model ---------------------------------------------------------------------------
    @torch.no_grad()
    def validate(self, result: ScoreAttribution, top: int = 5) -> pd.DataFrame:
        """For the `top` query-side and key-side terms of largest marginal (bias terms aside), remove the term's
        write from the residual the head reads (an edit of layers[L].resid_pre at its position) in the real model
        and put the measured score and pattern at the (first) key beside the frozen model's prediction. The
        prediction is exact for the frozen bilinear form; the real model also re-normalizes the edited residual
        (its pre-norm and q/k norm scales move), which is what the comparison measures."""
        layer, head, query = result.layer, result.head, result.query
        key = next(iter(result.weights))
        chosen = []
        for side, marginal in (("query", result.query_marginal()), ("key", result.key_marginal())):
            ranked = [s for s in marginal["site"] if not Site.parse(s).is_term]
            chosen += [(side, label) for label in ranked[:top]]
        model = self.model
        ids = self.rep.token_ids[None]
        capture = Capture(layers=[layer], attn={"scores", "pattern"}, mlp=frozenset(), embed=False,
                          final_norm_scale=False)
        splices = self.rep.transcoders.splices()
        rows = []
        for side, label in chosen:
            site = Site.parse(label)
            position = site.positions[0]
            terms = self.terms(layer, position)
            vector = terms.vectors[[s.label for s in terms.sites].index(label)]
            predicted_scores = self._predicted_scores(layer, head, query, position, label)
            edit = Add(Site(layer, "resid_pre", positions=(position,)), (-vector).to(model.dtype))
            run = model.run(ids, interventions=[edit], capture=capture, dictionaries=splices)
            record = run.stream.layers[layer].attn
            measured_scores = record.scores[0, head, query].float()
            rows.append({"side": side, "term": label, "position": position,
                         "predicted_score": float(predicted_scores[key]), "measured_score": float(measured_scores[key]),
                         "predicted_pattern": float(_pattern(predicted_scores)[key]),
                         "measured_pattern": float(record.pattern[0, head, query, key])})
        out = pd.DataFrame(rows)
        out.attrs.update({"head": result.head_site.label, "key": key, "score": result.run_scores[key],
                          "pattern": result.pattern[key]})
        return out

    @torch.no_grad()
    def _predicted_scores(self, layer: int, head: int, query: int, position: int, label: str) -> Tensor:
        """The head's scores at `query` over every key [key_pos] in the frozen model, the term `label` (at
        `position`) removed from the residual its layer reads there: (q - [p == q] Q_t) . (k - [p == k] K_t)."""
        attn = self.model.blocks[layer].attn
        kv = head // (attn.n_heads // attn.n_kv_heads)
        record = self.run.stream.layers[layer].attn
        scores = record.scores[0, head, query].float()
        q_terms, q_vectors = self.projected("q", layer, query)
        q = q_vectors[:, head].sum(0)
        if position == query:
            q = q - q_vectors[[s.label for s in q_terms.sites].index(label), head]
        raw = torch.full_like(scores, float("-inf"))
        for k in range(query + 1):
            if not bool(torch.isfinite(scores[k])):
                continue
            k_terms, k_vectors = self.projected("k", layer, k)
            kk = k_vectors[:, kv].sum(0)
            if position == k:
                kk = kk - k_vectors[[s.label for s in k_terms.sites].index(label), kv]
            raw[k] = attn.scale * (q @ kk)
        return _capped(raw, attn.softcap)


def _rows(value: Tensor | None, n: int) -> Tensor | None:
    """One position's frozen value [1 ...] repeated for n rows."""
    return None if value is None else value.expand(n, *value.shape[1:])


def _uncapped(scores: Tensor, softcap: float | None) -> Tensor:
    """The raw scores before a soft cap (cap * atanh(score / cap)); the scores themselves without one."""
    if softcap is None:
        return scores.double()
    return softcap * torch.atanh((scores.double() / softcap).clamp(-1 + 1e-15, 1 - 1e-15))


def _capped(raw: Tensor, softcap: float | None) -> Tensor:
    return raw if softcap is None else torch.tanh(raw / softcap) * softcap


def _pattern(scores: Tensor) -> Tensor:
    return torch.softmax(scores.double(), dim=-1)


def _marginal(sites: list[Site], values: Tensor, n: int | None = None) -> pd.DataFrame:
    order = values.abs().argsort(descending=True)[:n].tolist()  # labels made for the rows kept only
    return pd.DataFrame({"site": [sites[i].label for i in order], "value": values[order].double().cpu().numpy()})


def _whole(value: object, name: str) -> None:
    """Refuse a position or head that is not a whole number: int(1.5) and int(True) would read as 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ResidError(f"{param(name, value)} must be a whole number (an int; negative counts from the end), not "
                         f"{type(value).__name__}: int() would read {value!r} as another position or head.")
