"""FFN keys as pattern detectors: the corpus tokens that activate a neuron most (Geva et al. 2021,
"Transformer Feed-Forward Layers Are Key-Value Memories", section 3: a key's trigger examples).

Glossary: the *coefficient* m_i = post[i] of neuron i at a token says how strongly the token's prefix
matches the neuron's key; a *trigger* is a token with one of the k largest coefficients over the corpus;
its *context* is the text before it (and a little after), with the trigger marked ⟦like this⟧.

    df = neurons.top_activating(model, corpus.demo(), layers=[20], neurons=[5, 7], k=20)

Streaming: documents are tokenized (with BOS if the model prepends one), cut into windows of at most
`window` tokens (resid.analyses.corpus_windows: a long document becomes consecutive windows; each window is a
separate forward pass, so a trigger's context never reaches into the previous window), sorted by length and run in
padded batches.
Only the chosen layers' `post` is captured and only the last token is unembedded (the forward still runs
every layer: stopping early would take a hook resid does not offer, and bench_neurons.py shows the
bookkeeping is cheap next to the forward). A running top-k per
(layer, neuron) is kept on the model's device and merged with each batch's own top-k: memory is
O(k x neurons), never O(tokens x neurons). Padding and BOS positions never count as triggers (a BOS
token's activations are attention-sink outliers that would fill every list). The windows are scanned in shards
(resid.analyses.neurons.scan) whose top-k lists merge in any order, ties going to the earlier token, so the table is
the same in process and on Ray workers (`execution=Execution(executor="ray", workers=N)`).

Post-norms do not change a coefficient (the post-norm acts on the MLP's output, after m_i). Mixture of experts
(Mixtral): neurons are (expert, neuron) pairs, m_{e,i} = post[e, i]; a token counts as a trigger of expert e's
neurons only if it was routed to e (its coefficients elsewhere are not computed), and the rows get an `expert`
column after `layer`.

Ranking (`sign`): "positive" (default) ranks by m, largest first, as Geva et al. do; "negative" by -m
(for gated MLPs, whose coefficients take both signs, a negative m adds -v); "abs" by |m|.
"""

from collections.abc import Sequence
from typing import Literal

import numpy as np
import pandas as pd

from resid.analyses.checks import check_choice, check_k
from resid.analyses.corpus_windows import cut_windows
from resid.analyses.distributed.execution import Execution
from resid.analyses.io import corpus as corpora
from resid.analyses.io.provenance import describe
from resid.analyses.neurons.scan import scan
from resid.analyses.neurons.selection import Neurons, select, site_column
from resid.analyses.vocab import decode_ids
from resid.errors import ResidError
from resid.model import Transformer

Sign = Literal["positive", "negative", "abs"]
SIGNS: tuple[str, ...] = ("positive", "negative", "abs")
MARK = ("⟦", "⟧")


def top_activating(
    model: Transformer,
    corpus: corpora.Source,
    layers: int | Sequence[int] | None = None,
    neurons: Neurons = None,
    k: int = 20,
    context: int = 12,
    after: int = 4,
    sign: Sign = "positive",
    window: int = 256,
    experts: int | Sequence[int] | None = None,
    execution: Execution | None = None,
) -> pd.DataFrame:
    """The k corpus tokens with the largest coefficients of each chosen neuron (see the module docstring).
    experts (mixture-of-experts models only): None for all, an index or a list; the neurons of each.

    corpus: a list of strings or a .txt / .jsonl path (resid.analyses.corpus.load). layers: an index, a list, or
    None for all; neurons: resid.Sites of neurons or their labels, or None / "neuron" for all, or indices, the same
    neurons in each layer (resid.analyses.neurons.selection). One row per (layer, neuron, rank):
    site (the neuron's Site.label) layer neuron rank coefficient token_id token doc pos (token index in the
    document, BOS excluded) context (`context` tokens before the trigger, the trigger in ⟦ ⟧, `after` tokens after
    it).
    execution: how the scan runs (resid.analyses.Execution: executor, workers, batch_size windows per forward pass,
    progress); the same table on every executor. A scan is a reduction: it keeps no `out` store."""
    check_choice(sign, "sign", SIGNS)
    selection = select(model, layers, neurons, experts)
    layer_list, neuron_list, expert_list = selection.layers, selection.neurons, selection.experts
    k = check_k(k, "k")
    for name, value in (("context", context), ("after", after)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ResidError(f"{name} must be a non-negative number of tokens, got {value!r}.")
    texts = corpora.load(corpus)
    pieces = cut_windows(model, texts, window)
    best = scan(model, pieces, layer_list, neuron_list, k, sign, expert_list, execution)
    df = examples_frame(model, pieces, best, layer_list, neuron_list, context, after, expert_list)
    expert_column = df["expert"].to_numpy() if expert_list is not None else None
    df.insert(0, "site", site_column(df["layer"].to_numpy(), df["neuron"].to_numpy(), expert_column))
    df = selection.keep(df)
    parameters = {**selection.parameters(), "k": k, "context": context, "after": after, "sign": sign,
                  "window": window, "documents": len(texts), "windows": len(pieces)}
    df.attrs["provenance"] = describe(model, "neurons.top_activating", parameters)
    return df


def examples_frame(model, pieces, best, layers, neurons, context: int, after: int, experts=None) -> pd.DataFrame:
    """The table of a scan's top-k lists (`best`, per key of `layers`): one row per (layer, [expert,] neuron, rank)
    with the trigger token, its document and position, and its context (features.top_activating's too)."""
    frames = []
    for layer in layers:
        b = best[layer]
        score, coefficient, flat = (t.cpu().numpy() for t in (b.score, b.coefficient, b.flat))
        rank, column = np.nonzero(np.isfinite(score))  # fewer than k tokens in the corpus leave -inf
        per_expert = score.shape[1] // (1 if experts is None else len(experts))
        neuron_ids = np.arange(per_expert) if neurons is None else np.asarray(neurons)
        where = {"layer": np.full(len(rank), layer, dtype=np.int64)}
        if experts is not None:
            where["expert"] = np.asarray(experts, dtype=np.int64)[column // per_expert]
        frames.append(pd.DataFrame({
            **where,
            "neuron": neuron_ids[column % per_expert].astype(np.int64),
            "rank": (rank + 1).astype(np.int64),
            "coefficient": coefficient[rank, column].astype(np.float64),
            "_flat": flat[rank, column],
        }))
    order = ["layer", "neuron", "rank"] if experts is None else ["layer", "expert", "neuron", "rank"]
    df = pd.concat(frames, ignore_index=True).sort_values(order, ignore_index=True)
    flat = df.pop("_flat").to_numpy()
    window_index, pos = flat >> 20, flat & (2**20 - 1)
    # All windows as one [window width] array (-1 past each end), so snippets are gathered, not looped.
    lengths = np.array([len(w.ids) for w in pieces])
    ids = np.full((len(pieces), lengths.max()), -1, dtype=np.int64)
    for row, w in enumerate(pieces):
        ids[row, : len(w)] = w.ids
    first = np.array([int(w.bos) for w in pieces])[window_index]  # the first position a snippet may show
    trigger = ids[window_index, pos]
    at = df.columns.get_loc("coefficient") + 1  # 4, or 5 with an expert column
    df.insert(at, "token_id", trigger)
    df.insert(at + 1, "token", decode_ids(model, trigger))
    df["doc"] = np.array([w.doc for w in pieces], dtype=np.int64)[window_index]
    df["pos"] = np.array([w.start for w in pieces], dtype=np.int64)[window_index] + pos - first
    before = _snippets(ids, window_index, pos, np.arange(-context, 0), first)
    later = _snippets(ids, window_index, pos, np.arange(1, after + 1), first)
    tokenizer = model.require_tokenizer().tokenizer
    before, later = (tokenizer.decode_batch(x, skip_special_tokens=False) if x else [] for x in (before, later))
    df["context"] = [f"{b}{MARK[0]}{t}{MARK[1]}{a}" for b, t, a in zip(before, df["token"], later)]
    return df


def _snippets(ids: np.ndarray, window: np.ndarray, pos: np.ndarray, offsets: np.ndarray, first: np.ndarray):
    """Per row, the token ids at pos + offsets inside its window (from `first` on), as lists. The valid
    ids of a row are contiguous (cut only at the window's start or end), so each row is one slice."""
    at = pos[:, None] + offsets[None, :]
    inside = (at >= first[:, None]) & (at < ids.shape[1])
    gathered = np.where(inside, ids[window[:, None], np.clip(at, 0, ids.shape[1] - 1)], -1)
    count = (gathered >= 0).sum(1).tolist()
    if offsets.size and offsets[0] < 0:  # before the trigger: invalid ids lead
        return [row[len(row) - n :] for row, n in zip(gathered.tolist(), count)]
    return [row[:n] for row, n in zip(gathered.tolist(), count)]
