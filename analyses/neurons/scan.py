"""The streaming part of neurons.top_activating as a reduction over corpus shards.

Glossary: a *window* is at most `window` tokens of one document (resid.analyses.corpus_windows cuts them, longest
first); a *shard* is a run of consecutive windows, SHARD_BATCHES whole batches (fewer for small corpora on several
workers): batches are cut from the start of each shard, so the shards change no batch. Each shard is scanned in
padded batches into its own running top-k per neuron (resid.analyses.neurons.topk), and the shards' lists are merged
as they finish: the merge is associative and commutative with ties broken by the tokens' global flat ids, so the
table is the same in process and on any number of Ray workers, whatever order they finish in.

What a scan reads per token is a *reader* (`Reader`): a list of keys, and per key a [batch pos n] tensor of values
to rank with the mask of the tokens that may rank. `NeuronReader` reads MLP coefficients (neurons.top_activating);
resid.analyses.features.scan reads a dictionary's feature activations through this same job. A reader may also
*tally* each batch into an integer tensor per key (a histogram): tallies are summed over batches and shards, exact
in any order."""

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from resid.analyses.corpus_windows import Window, batch_tokens
from resid.analyses.distributed.driver import drive
from resid.analyses.distributed.execution import Execution, as_execution
from resid.analyses.distributed.executor import InProcess, Job
from resid.analyses.neurons.topk import TopK
from resid.batching import BatchSize, model_batch_size, with_backoff
from resid.capture import Capture
from resid.model import Transformer

SHARD_BATCHES = 4  # batches per shard: enough to keep a worker busy, few enough to balance 2+ workers


@dataclass(frozen=True)
class Shard:
    start: int  # global index of the shard's first window (flat ids count from it)
    windows: tuple[Window, ...]


class Reader:
    """What a scan reads per token (see the module docstring). Subclasses are plain dataclasses: a reader travels to
    Ray workers with its job."""

    def keys(self) -> list:
        """One top-k list per key, in this order."""
        raise NotImplementedError

    def columns(self, model: Transformer, key: object) -> int:
        """The number of values per token of `key` (the width of its top-k lists)."""
        raise NotImplementedError

    def kept_bytes(self, model: Transformer, width: int) -> int:
        """Bytes per batch row (of `width` tokens) the read keeps until the batch is folded in (for "auto")."""
        raise NotImplementedError

    def setup(self, model: Transformer) -> object:
        """Per-worker state (tensors on the worker's device) that `read` takes."""
        raise NotImplementedError

    def capture(self) -> Capture:
        raise NotImplementedError

    def read(self, state: object, run, valid: Bool[Tensor, "batch pos"]) -> dict:
        """{key: (values [batch pos n], mask [batch pos] or [batch pos n] of the tokens that may rank)}."""
        raise NotImplementedError

    def tally(self, state: object, values: Tensor, valid: Bool[Tensor, "batch pos"]) -> Tensor | None:
        """An integer tensor the batch adds to the key's tally (None: no tally). `valid`: the scanned tokens."""
        return None


@dataclass(frozen=True)
class NeuronReader(Reader):
    """MLP coefficients m_i = post[i] of the chosen layers (keys), neurons and experts (as checked by
    select_layers / select_neurons / select_experts); with experts, the neuron axis is (expert, neuron) flattened and
    a token ranks for expert e's neurons only if it was routed to e."""

    layers: list[int]
    neurons: list[int] | None
    experts: list[int] | None

    def keys(self) -> list:
        return list(self.layers)

    def columns(self, model: Transformer, key: object) -> int:
        n_neurons = model.config.d_mlp if self.neurons is None else len(self.neurons)
        return n_neurons if self.experts is None else n_neurons * len(self.experts)

    def kept_bytes(self, model: Transformer, width: int) -> int:
        # The captured `post` of every chosen layer lives until the batch is folded in (every expert's, with experts).
        return len(self.layers) * model.config.d_mlp * max(1, model.config.n_experts) * width * model.dtype.itemsize

    def setup(self, model: Transformer) -> tuple:
        index = None if self.neurons is None else torch.tensor(self.neurons, device=model.device)
        chosen = None if self.experts is None else torch.tensor(self.experts, device=model.device)
        return index, chosen

    def capture(self) -> Capture:
        mlp = {"post", "expert_weights"} if self.experts is not None else {"post"}
        return Capture(layers=self.layers, attn=frozenset(), mlp=mlp, embed=False, final_norm_scale=False)

    def read(self, state: tuple, run, valid: Bool[Tensor, "batch pos"]) -> dict:
        index, chosen = state
        found = {}
        for layer in self.layers:
            record = run.stream.layers[layer].mlp
            post = record.post if index is None else record.post.index_select(-1, index)
            routed = valid
            if chosen is not None:  # [batch pos expert neuron] -> [batch pos (expert neuron)]
                post = post.index_select(2, chosen)
                routed = valid[..., None, None] & (record.expert_weights.index_select(2, chosen) > 0)[..., None]
                routed = routed.expand(post.shape).flatten(2)
                post = post.flatten(2)
            found[layer] = (post, routed)
        return found


@dataclass
class ScanJob(Job):
    """Per shard, the running top-k of each of the reader's keys and their tallies, as numpy arrays
    ({key: ((score, coefficient, flat), tally or None)})."""

    pad: int
    reader: Reader
    k: int
    sign: str
    batch_size: int | str  # "auto": from the worker's own device (and the widest window, the first one)
    width: int
    shards: list  # the corpus's shards (`shards`), planned on the driver for its executor's workers
    skip_first: bool = False  # each window's first position is no trigger (an added BOS never is)

    name = "top activating"
    unit = "tok"

    def plan(self, done: set, workers: int | None, per_worker: int) -> list:
        planned, self.shards = self.shards, []  # the shards travel with their chunks, not with the job
        return planned

    def size(self, shard: "Shard") -> int:
        return sum(len(w) for w in shard.windows)

    def finish(self, results: list) -> tuple[dict, dict]:
        """Each key's top-k, the shards' lists merged in shard order (the merge is associative and commutative
        anyway, ties broken by flat token ids), and each key's tally summed (None without one)."""
        best: dict = {}
        tallies: dict = {}
        for part in results:
            for key, (arrays, tally) in part.items():
                found = TopK.from_numpy(arrays)
                best[key] = best[key].merge(found) if key in best else found
                if tally is not None:
                    tallies[key] = tallies[key] + tally if key in tallies else tally.copy()
        return best, tallies

    def setup(self, model: Transformer) -> tuple:
        size = _batch_size(model, self.batch_size, self.width, self.reader)
        return model, size, self.reader.setup(model), self.reader.capture()

    def run(self, state: tuple, shard: Shard) -> Iterator[dict]:
        model, size, read_state, capture = state
        keys = self.reader.keys()
        best = {key: TopK.empty(self.k, self.reader.columns(model, key), model.device) for key in keys}
        tallies: dict = {key: None for key in keys}
        start = 0
        while start < len(shard.windows):
            def work(rows: int, start: int = start) -> tuple[int, dict]:
                chunk = shard.windows[start : start + rows]
                tokens, valid = batch_tokens(chunk, self.pad, model.device)
                if self.skip_first:
                    valid[:, 0] = False
                run = model.run(tokens, capture=capture, logits_at="last")  # unembed one row, not all
                flat_ids = _flat_ids(shard.start + start, len(chunk), tokens.ids.shape[1], model.device)
                merged = {}  # committed only once every key is done: an out-of-memory retry must not count twice
                for key, (values, mask) in self.reader.read(read_state, run, valid).items():
                    tally = self.reader.tally(read_state, values, valid)
                    if tally is not None and tallies[key] is not None:
                        tally = tallies[key] + tally
                    merged[key] = (best[key].add(values, mask, flat_ids, self.sign), tally)
                return len(chunk), merged

            done, merged = with_backoff(work, size)
            for key, (topk, tally) in merged.items():
                best[key], tallies[key] = topk, tally
            start += done
        yield {key: (best[key].numpy(), None if tallies[key] is None else tallies[key].cpu().numpy()) for key in keys}

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
    experts: list[int] | None = None,
    execution: Execution | None = None,
) -> dict[int, TopK]:
    """Run `pieces` (from resid.analyses.corpus_windows.cut_windows) shard by shard on the one driver as `execution`
    says (in process by default) and merge each layer's top-k (checked layers, neurons and experts, as from
    select_layers / select_neurons / select_experts). With experts, the neuron axis of each TopK is (expert, neuron)
    flattened. The lists come back on the CPU."""
    reader = NeuronReader(layers, neurons, experts)
    return scan_with(model, pieces, reader, k, sign, execution=execution)[0]


def scan_with(
    model: Transformer,
    pieces: Sequence[Window],
    reader: Reader,
    k: int,
    sign: str = "positive",
    skip_first: bool = False,
    execution: Execution | None = None,
) -> tuple[dict, dict]:
    """Scan `pieces` with any reader: ({key: TopK}, {key: summed tally as numpy}) on the CPU. The shards are cut
    for the execution's workers, so its executor is made here (and closed here if made here). A scan is a
    reduction: the driver refuses an Execution with `out`. skip_first: no window's first position is a trigger
    (nor tallied)."""
    with as_execution(execution).started() as execution:
        runner = execution.executor
        width = max(len(w) for w in pieces)
        size = _batch_size(model, execution.batch_size, width, reader)
        planned = shards(pieces, size.value, None if isinstance(runner, InProcess) else runner.workers)
        job = ScanJob(model.require_tokenizer().pad_token_id, reader, k, sign, execution.batch_size, width, planned,
                      skip_first)
        return drive(model, job, execution)


def _flat_ids(start: int, rows: int, width: int, device: torch.device) -> Int[Tensor, "batch pos"]:
    """window index * 2^20 + position: which token a score came from, as one int64."""
    window_index = torch.arange(start, start + rows, device=device)[:, None]
    return window_index * 2**20 + torch.arange(width, device=device)


def _batch_size(model: Transformer, batch_size: int | str, width: int, reader: Reader) -> BatchSize:
    if batch_size != "auto":
        return BatchSize(batch_size)
    return BatchSize(model_batch_size(model, width, kept_bytes_per_row=reader.kept_bytes(model, width)))
