"""The streaming part of neurons.top_activating as a reduction over corpus shards.

Glossary: a *window* is at most `window` tokens of one document (keys.windows cuts them, longest first); a
*shard* is a run of consecutive windows, SHARD_BATCHES whole batches (fewer for small corpora on several
workers): batches are cut from the start of each shard, so the shards change no batch. Each shard is scanned in
padded batches into its own running top-k per neuron (resid.analyses.neurons.topk), and the shards' lists are merged
as they finish: the merge is associative and commutative with ties broken by the tokens' global flat ids, so the
table is the same in process and on any number of Ray workers, whatever order they finish in."""

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Bool, Int
from torch import Tensor

from resid.analyses.distributed.driver import drive
from resid.analyses.distributed.executor import Executor, InProcess, Job, resolve
from resid.analyses.neurons.topk import TopK
from resid.batching import BatchSize, model_batch_size, with_backoff
from resid.capture import Capture
from resid.model import Transformer
from resid.tokenizer import Tokens

SHARD_BATCHES = 4  # batches per shard: enough to keep a worker busy, few enough to balance 2+ workers


@dataclass(frozen=True)
class Window:
    doc: int  # index of the document in the corpus
    start: int  # index in the document's tokens (BOS excluded) of the window's first real token
    ids: np.ndarray  # token ids fed to the model (BOS first if the model prepends one)
    bos: bool  # whether ids[0] is a BOS added here

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class Shard:
    start: int  # global index of the shard's first window (flat ids count from it)
    windows: tuple[Window, ...]


@dataclass
class ScanJob(Job):
    """Per shard, the running top-k of each chosen layer, as numpy arrays ({layer: (score, coefficient, flat)})."""

    pad: int
    layers: list[int]
    neurons: list[int] | None
    k: int
    sign: str
    batch_size: int | str  # "auto": from the worker's own device (and the widest window, the first one)
    width: int
    experts: list[int] | None
    shards: list  # the corpus's shards (`shards`), planned on the driver for its executor's workers

    name = "top activating"
    unit = "tok"

    def plan(self, done: set, workers: int | None, per_worker: int) -> list:
        planned, self.shards = self.shards, []  # the shards travel with their chunks, not with the job
        return planned

    def size(self, shard: "Shard") -> int:
        return sum(len(w) for w in shard.windows)

    def finish(self, results: list) -> dict:
        """Each layer's top-k, the shards' lists merged in shard order (the merge is associative and commutative
        anyway, ties broken by flat token ids)."""
        best: dict[int, TopK] = {}
        for part in results:
            for layer, arrays in part.items():
                found = TopK.from_numpy(arrays)
                best[layer] = best[layer].merge(found) if layer in best else found
        return best

    def setup(self, model: Transformer) -> tuple:
        size = _batch_size(model, self.batch_size, self.width, len(self.layers))
        index = None if self.neurons is None else torch.tensor(self.neurons, device=model.device)
        chosen = None if self.experts is None else torch.tensor(self.experts, device=model.device)
        mlp = {"post", "expert_weights"} if self.experts is not None else {"post"}
        capture = Capture(layers=self.layers, attn=frozenset(), mlp=mlp, embed=False, final_norm_scale=False)
        return model, size, index, chosen, capture

    def run(self, state: tuple, shard: Shard) -> Iterator[dict]:
        model, size, index, chosen, capture = state
        n_neurons = model.config.d_mlp if self.neurons is None else len(self.neurons)
        columns = n_neurons if self.experts is None else n_neurons * len(self.experts)
        best = {layer: TopK.empty(self.k, columns, model.device) for layer in self.layers}
        start = 0
        while start < len(shard.windows):
            def work(rows: int, start: int = start) -> tuple[int, dict]:
                chunk = shard.windows[start : start + rows]
                tokens, valid = batch_tokens(chunk, self.pad, model.device)
                run = model.run(tokens, capture=capture, logits_at="last")  # unembed one row, not all
                flat_ids = _flat_ids(shard.start + start, len(chunk), tokens.ids.shape[1], model.device)
                merged = {}  # committed only once every layer is done: an out-of-memory retry must not count twice
                for layer in self.layers:
                    record = run.stream.layers[layer].mlp
                    post = record.post if index is None else record.post.index_select(-1, index)
                    routed = valid
                    if chosen is not None:  # [batch pos expert neuron] -> [batch pos (expert neuron)]
                        post = post.index_select(2, chosen)
                        routed = valid[..., None, None] & (record.expert_weights.index_select(2, chosen) > 0)[..., None]
                        routed = routed.expand(post.shape).flatten(2)
                        post = post.flatten(2)
                    merged[layer] = best[layer].add(post, routed, flat_ids, self.sign)
                return len(chunk), merged

            done, merged = with_backoff(work, size)
            best.update(merged)
            start += done
        yield {layer: topk.numpy() for layer, topk in best.items()}

    def combine(self, pieces: list) -> dict:
        return pieces[0]


def shards(pieces: Sequence[Window], batch: int, workers: int | None = None) -> list[Shard]:
    """Consecutive runs of whole batches of `batch` windows: SHARD_BATCHES of them, or fewer so that `workers`
    remote workers get two shards each. A shard is whole batches, so its size changes no batch and no number."""
    per_shard = SHARD_BATCHES
    if workers is not None:
        per_shard = max(1, min(SHARD_BATCHES, math.ceil(len(pieces) / batch) // (2 * workers)))
    step = per_shard * batch
    return [Shard(start, tuple(pieces[start : start + step])) for start in range(0, len(pieces), step)]


def scan(
    model: Transformer,
    pieces: Sequence[Window],
    layers: list[int],
    neurons: list[int] | None,
    k: int,
    sign: str = "positive",
    batch_size: int | str = "auto",
    progress: bool = True,
    experts: list[int] | None = None,
    executor: Executor | str | None = None,
    workers: int | None = None,
) -> dict[int, TopK]:
    """Run `pieces` (from keys.windows) shard by shard on the one driver (in process by default) and merge each
    layer's top-k (checked layers, neurons and experts, as from select_layers / select_neurons / select_experts).
    With experts, the neuron axis of each TopK is (expert, neuron) flattened. The lists come back on the CPU."""
    runner, owned = resolve(executor, workers)
    try:
        width = max(len(w) for w in pieces)
        size = _batch_size(model, batch_size, width, len(layers))
        planned = shards(pieces, size.value, None if isinstance(runner, InProcess) else runner.workers)
        job = ScanJob(model.require_tokenizer().pad_token_id, layers, neurons, k, sign, batch_size, width, experts,
                      planned)
        return drive(model, job, executor=runner, progress=progress)
    finally:
        if owned:
            runner.close()


def batch_tokens(
    chunk: Sequence[Window], pad_token_id: int, device: torch.device
) -> tuple[Tokens, Bool[Tensor, "batch pos"]]:
    """Right-padded Tokens for a chunk of windows, and the mask of positions that may be triggers
    (real tokens that are not an added BOS) [batch pos]."""
    tokens = Tokens.pad([w.ids.tolist() for w in chunk], pad_token_id, "right").to(device)
    valid = tokens.attention_mask.clone()
    valid[:, 0] &= torch.tensor([not w.bos for w in chunk], device=device)
    return tokens, valid


def _flat_ids(start: int, rows: int, width: int, device: torch.device) -> Int[Tensor, "batch pos"]:
    """window index * 2^20 + position: which token a score came from, as one int64."""
    window_index = torch.arange(start, start + rows, device=device)[:, None]
    return window_index * 2**20 + torch.arange(width, device=device)


def _batch_size(model: Transformer, batch_size: int | str, width: int, n_layers: int) -> BatchSize:
    if batch_size != "auto":
        return BatchSize(batch_size)
    # The captured `post` of every chosen layer lives until the batch is folded in (every expert's, with experts).
    kept = n_layers * model.config.d_mlp * max(1, model.config.n_experts) * width * model.dtype.itemsize
    return BatchSize(model_batch_size(model, width, kept_bytes_per_row=kept))
