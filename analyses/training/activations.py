"""The activation pipeline: a corpus through the model in padded batches, the tensors the dictionaries read, a
shuffling buffer, training batches.

Glossary: a *window* is at most `window` tokens of one document (resid.analyses.neurons.keys.windows: long documents
become consecutive windows, BOS first if the model prepends one); a *block* is the shortest run of consecutive
windows of the shuffled window order that holds at least `buffer_tokens` training tokens (the last block of an
epoch may hold fewer); a *point* is the tensor a dictionary reads, a resid.Site as a HookPoint
(resid.dictionaries.hooks: the Site, and whether a norm's output is read standardized, before its gain).

    source = Activations(model, texts, [Site(3, "resid_post")], batch_size=4096)
    block = source.block(0)                      # {HookPoint: [token d]} float32, the same tokens per point
    for position, batch in batches(block, 0, 4096, skip=0):   # {HookPoint: [batch_size d]}, and where the stream is

Generating a block is a chunk of the BlockJob (resid.analyses.distributed): it runs in process or on Ray workers,
one model per worker, and training (resid.analyses.training.loop) takes the blocks in order whoever made them.

The order, a function of the seed alone (so a resumed run sees the same batches):
1. The windows are permuted (torch.randperm seeded with (seed, epoch)); the corpus repeats, in a new order, when
   training needs more tokens than it has.
2. A block's windows run through the model longest first, in forward batches of at most forward_batch x window
   tokens once padded, cut where the padding is least (forward_batches), right-padded (resid.tokenizer.Tokens), up
   to the deepest hooked layer (stop_at_layer), once for every hook: each hook's tensor is read at the same
   positions (resid.dictionaries.hooks.read), so several dictionaries train from one forward pass, and a
   transcoder's input and output rows are the same tokens.
   With autocast=True the forward runs under torch.autocast(bfloat16) on the model's device (SAELens's
   autocast_lm; CPU too): matrix products in bf16, about 1.7x the fp32 tokens/s on a 2-core AVX-512 CPU, the
   activations within about 1% (relative norm) of fp32's. The buffer is float32 either way.
3. Padding is dropped, and so is each window's first position unless keep_bos=True: the BOS the model prepends, or
   the first token of a model that prepends none, which is then the attention sink (training_positions); so are the
   tokens whose norm at any point's tensor exceeds max_norm_ratio (default 10) x the block's median there: sinks
   that fall later in a document (`ordinary`; max_norm_ratio=None keeps them).
4. The block's tokens are shuffled (a permutation seeded with (seed, block)) and cut into batches of batch_size
   tokens; the remainder of a block (fewer than batch_size tokens) is dropped.
A block's activations are the shuffling buffer: about buffer_tokens x the points' widths, float32, on `device`
(2^16 tokens of SmolLM2's d_model 576 are 150 MB per point; 30 transcoders read 60 tensors: 9 GB), filled in place;
a buffer that would not fit in the device's free memory is refused before any work, naming buffer_tokens.
A `Position` (block, batch in block) says where the stream is, which is all a checkpoint needs.
"""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Bool
from torch import Tensor

from resid.analyses.corpus_windows import Window, batch_tokens, cut_windows
from resid.analyses.distributed.executor import Job
from resid.analyses.distributed.progress import meter
from resid.batching import available_bytes
from resid.capture import Capture
from resid.dictionaries.hooks import HookPoint, point_of, read, width
from resid.errors import ResidError, param
from resid.model import Transformer
from resid.run import Run
from resid.sites import Site
from resid.tokenizer import Tokens


@dataclass(frozen=True)
class Position:
    block: int  # blocks started (0-based index of the current one)
    batch: int  # batches of that block already given out


@dataclass(frozen=True)
class Block:
    """One chunk of activation generation: block `index` (counted on across epochs: it seeds the shuffle) and its
    windows."""

    index: int
    windows: tuple[Window, ...]


@dataclass
class BlockJob(Job):
    """What a block costs to make, as plain data (it travels to Ray workers): each chunk is a Block, its one result
    the block's shuffled training tokens per point, {HookPoint: [token d]} float32 (see the module docstring)."""

    points: tuple[HookPoint, ...]
    pad: int
    window: int
    forward_batch: int
    keep_bos: bool
    seed: int
    autocast: bool
    max_norm_ratio: float | None
    device: str | None  # where the block is made (None: the model's device)
    progress: bool = False  # a bar of the buffer filling (in process: training waits on it)

    name = "activations"
    unit = "tok"

    def size(self, block: Block) -> int:
        return sum(len(w) for w in block.windows)

    def setup(self, model: Transformer) -> tuple:
        capture = capture_for(self.points)
        # the layers a forward runs: up to the deepest one read (a layer-15 point of a 30-layer model runs 16)
        stop = max(0 if p.site.layer is None else p.site.layer + 1 for p in self.points)
        device = torch.device(self.device) if self.device is not None else model.device
        return model, capture, stop, device

    @torch.no_grad()
    def run(self, state: tuple, block: Block) -> Iterator[dict[HookPoint, Tensor]]:
        """Filled in place and permuted one point at a time, so that the block costs its own size plus one point's."""
        model, capture, stop, device = state
        # longest first, cut where padding is least (the block's tokens are shuffled afterwards)
        chunk = sorted(block.windows, key=len, reverse=True)
        total = sum(len(w) - (not self.keep_bos) for w in chunk)
        found = {p: torch.empty(total, width(p, model.config), device=device) for p in self.points}
        filled = 0
        bar = meter(self.progress, sum(len(w) for w in chunk), f"filling the activation buffer ({block.index + 1})",
                    "tok", unit_scale=True, leave=False)
        for start, end in forward_batches([len(w) for w in chunk], self.forward_batch * self.window):
            part = chunk[start:end]
            bar.update(sum(len(w) for w in part))
            tokens = batch_tokens(part, self.pad, model.device)[0]
            # the rows kept, as one index for every point: the forward batch's one synchronisation
            rows = training_positions(tokens, self.keep_bos).flatten().nonzero().squeeze(1)
            with torch.autocast(model.device.type, torch.bfloat16, enabled=self.autocast):
                run = model.run(tokens, capture=capture, logits_at="last", stop_at_layer=stop)
            n = len(rows)
            for point, value in read_points(run, model, self.points):
                found[point][filled:filled + n] = value.flatten(0, 1)[rows]
            filled += n
        bar.close()
        keep = torch.ones(total, dtype=torch.bool, device=device)
        if self.max_norm_ratio is not None:
            for tensor in found.values():
                keep &= ordinary(tensor.norm(dim=-1), self.max_norm_ratio)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + 7919 * (block.index + 1))
        kept = keep.nonzero().squeeze(1)
        order = kept[torch.randperm(len(kept), generator=g).to(device)]
        for point in self.points:  # one point's copy at a time
            found[point] = found[point][order]
        yield found

    def combine(self, pieces: list) -> dict[HookPoint, Tensor]:
        return pieces[0]


class Activations:
    """The plan of the training tokens of `points` (Sites, or HookPoints), from `texts` run through `model`: which
    windows make each block (see the module docstring); `job()` makes them, `block(b)` here and now."""

    def __init__(self, model: Transformer, texts: Sequence[str], points: Sequence[Site | HookPoint],
                 batch_size: int = 4096, window: int = 256, forward_batch: int = 8, buffer_tokens: int = 2**16,
                 keep_bos: bool = False, seed: int = 0, device: torch.device | str | None = None,
                 autocast: bool = False, max_norm_ratio: float | None = 10.0):
        for name, value in (("batch_size", batch_size), ("forward_batch", forward_batch),
                            ("buffer_tokens", buffer_tokens)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ResidError(f"{param(name, value)} must be a positive integer.")
        self.model, self.batch_size, self.forward_batch = model, batch_size, forward_batch
        self.keep_bos, self.seed, self.autocast = keep_bos, seed, autocast
        self.max_norm_ratio = check_ratio(max_norm_ratio)
        self.device = torch.device(device) if device is not None else model.device
        self.points = list(dict.fromkeys(p if isinstance(p, HookPoint) else point_of(p, model.config)
                                         for p in points))
        self.windows, self.window = cut_windows(model, texts, window), window
        self.buffer_tokens = buffer_tokens
        self.pad = model.require_tokenizer().pad_token_id
        self._epochs: list[list[list[int]]] = []  # per epoch, the window indices of each block
        per_block = self.tokens_per_block()
        if max(per_block) < batch_size:
            raise ResidError(f"The buffer holds at most {max(per_block)} training tokens, fewer than one batch of "
                             f"{param('batch_size', batch_size)}: raise {param('buffer_tokens', buffer_tokens)}, give "
                             "more text, or a smaller batch.")
        need, free = self.buffer_bytes(), available_bytes(self.device)
        if free is not None and need > 0.8 * free:
            fit = int(buffer_tokens * 0.8 * free / need)
            raise ResidError(
                f"The shuffling buffer needs {need / 2**30:.1f} GiB ({max(per_block)} tokens x {len(self.points)} "
                f"tensors of width {sum(self.width(p) for p in self.points) // len(self.points)} on average x 4 "
                f"bytes), more than the {free / 2**30:.1f} GiB free on {self.device}: lower "
                f"{param('buffer_tokens', buffer_tokens)} to at most {fit} (a smaller buffer shuffles across fewer "
                "documents), or train fewer layers per run.")

    def width(self, point: HookPoint) -> int:
        return width(point, self.model.config)

    def job(self, device: torch.device | str | None = None, progress: bool = False) -> BlockJob:
        """The BlockJob that makes this plan's blocks on `device` (None: each worker's model's device); progress: a
        bar of each buffer filling."""
        return BlockJob(tuple(self.points), self.pad, self.window, self.forward_batch, self.keep_bos, self.seed,
                        self.autocast, self.max_norm_ratio, None if device is None else str(device), progress)

    def blocks(self, start: int = 0) -> Iterator[Block]:
        """Every block from `start` on, endlessly (the corpus repeats, in a new order each epoch)."""
        index = start
        while True:
            yield Block(index, tuple(self.windows_of(index)))
            index += 1

    def block(self, index: int) -> dict[HookPoint, Tensor]:
        """The shuffled training tokens of block `index`, per point: {point: [token d]} float32 on self.device,
        made in this process."""
        job = self.job(self.device)
        (found,) = job.run(job.setup(self.model), Block(index, tuple(self.windows_of(index))))
        return found

    def _tokens(self, w: Window) -> int:
        """Training tokens of a window: no padding, no first position unless kept (training_positions)."""
        return len(w) - (not self.keep_bos)

    def tokens_per_block(self) -> list[int]:
        """Training tokens of each block of the first epoch."""
        return [sum(self._tokens(self.windows[i]) for i in block) for block in self._epoch(0)]

    def _epoch(self, epoch: int) -> list[list[int]]:
        """The blocks of epoch `epoch`: its seeded window order cut where each block reaches buffer_tokens."""
        while len(self._epochs) <= epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + len(self._epochs))
            blocks, current, count = [], [], 0
            for i in torch.randperm(len(self.windows), generator=g).tolist():
                current.append(i)
                count += self._tokens(self.windows[i])
                if count >= self.buffer_tokens:
                    blocks.append(current)
                    current, count = [], 0
            self._epochs.append(blocks + ([current] if current else []))
        return self._epochs[epoch]

    def windows_of(self, block: int) -> list[Window]:
        """The windows of global block `block` (blocks count on across epochs)."""
        epoch = 0
        while block >= len(self._epoch(epoch)):
            block -= len(self._epoch(epoch))
            epoch += 1
        return [self.windows[i] for i in self._epoch(epoch)[block]]

    def buffer_bytes(self) -> int:
        """The largest block's float32 activations, every point together."""
        return max(self.tokens_per_block()) * sum(self.width(p) for p in self.points) * 4


def batches(found: dict[HookPoint, Tensor], block: int, batch_size: int, skip: int = 0
            ) -> Iterator[tuple[Position, dict[HookPoint, Tensor]]]:
    """The training batches of block `block`'s tokens `found`, from batch `skip` on, each with the Position after
    it; the remainder (fewer than batch_size tokens) is dropped. A batch is a copy, so that holding it does not keep
    the block alive while the next one fills."""
    n = len(next(iter(found.values()))) // batch_size
    for i in range(skip, n):
        span = slice(i * batch_size, (i + 1) * batch_size)
        yield Position(block, i + 1), {point: tensor[span].clone() for point, tensor in found.items()}


def read_points(run: Run, model: Transformer, points: Sequence[HookPoint]) -> Iterator[tuple[HookPoint, Tensor]]:
    """(point, its tensor [batch pos d]) for each of `points`, as resid.dictionaries.hooks.read gives them, the
    residuals they read taken from one walk of the stream's running sum in stream order (_Walk): 2 n_layers
    additions for every layer's points, where reading each from the embeddings costs n_layers^2 (900 additions of a
    forward batch for SmolLM2's 30 transcoders)."""
    walk = _Walk(run)
    for point in sorted(points, key=lambda p: -1 if p.site.layer is None else p.site.layer):
        yield point, read(walk, model, point)


class _Walk:
    """A run as resid.dictionaries.hooks.read sees it (its `stream`'s layer records and residuals, its `read`),
    whose residuals come from one walk of ResidualStream.running: each read goes on from where the last one stopped
    (a site already passed restarts the walk, so any order is right and stream order is cheapest), and only the
    residuals read are kept."""

    def __init__(self, run: Run):
        self.run, self.layers, self.parallel = run, run.stream.layers, run.stream.parallel
        self._walk: Iterator[tuple[Site, Tensor]] = iter(())

    @property
    def stream(self) -> "_Walk":
        return self

    def read(self, site: Site) -> Tensor:
        if site.part in ("resid_pre", "resid_mid", "resid_post") and site.positions is None:
            return getattr(self, site.part)(site.layer)
        return self.run.read(site)

    def resid_pre(self, layer: int) -> Tensor:
        if layer > 0 and "resid_pre" not in self.layers[layer].deltas:  # running() yields it only where edited
            return self._at(Site(layer - 1, "resid_post"))
        return self._at(Site(layer, "resid_pre"))

    def resid_mid(self, layer: int) -> Tensor | None:
        return None if self.parallel else self._at(Site(layer, "resid_mid"))

    def resid_post(self, layer: int) -> Tensor:
        return self._at(Site(layer, "resid_post"))

    def _at(self, site: Site) -> Tensor:
        for _ in range(2):  # on from here, then once from the embeddings
            for at, resid in self._walk:
                if at == site:
                    return resid
            self._walk = self.run.stream.running("sublayer")
        raise ResidError(f"{site.label} is not a site of this stream.")


def training_positions(tokens: Tokens, keep_bos: bool = False) -> Bool[Tensor, "batch pos"]:
    """The positions of right-padded windows that dictionaries train on (and evaluate splices): the real tokens,
    without each window's first position unless keep_bos. That position is the BOS the model prepends or, for a model
    that prepends none (SmolLM2, GPT-2), the window's first token, which plays BOS's part as the attention sink: from
    SmolLM2's early layers on its residual has ~100x the norm of any other token's, and left in, it would be most of
    a batch's variance (every FVU would measure it) and the features the dictionary spends on it."""
    valid = tokens.attention_mask.clone()
    if not keep_bos:
        valid[:, 0] = False
    return valid


def ordinary(norms: Tensor, ratio: float) -> Tensor:
    """The tokens whose norm is at most `ratio` x the median of `norms` [token] (a mask). The others are attention
    sinks past the first position: in SmolLM2 a few tokens early in a document (13 of 131k demo-corpus tokens at
    layer 15 above 1,000, after the first positions are dropped) carry residual norms up to 23,000 against a median
    of 170 and a largest ordinary norm of about 540; one of them outweighs a whole batch's variance."""
    if norms.numel() == 0:
        return torch.ones_like(norms, dtype=torch.bool)
    return norms <= ratio * norms.median()


def check_ratio(ratio: float | None) -> float | None:
    """max_norm_ratio as given, if it is None or a number above 1 (a multiple of the median norm)."""
    if ratio is not None and not (isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and ratio > 1):
        raise ResidError(f"{param('max_norm_ratio', ratio)} must be a number above 1 (a multiple of the median "
                         "norm), or None to keep every token.")
    return ratio


def forward_batches(lengths: Sequence[int], most: int, overhead: int = 40) -> list[tuple[int, int]]:
    """Where to cut windows sorted longest first into forward batches, as (start, end) spans: each batch holds at
    most `most` tokens once padded to its first (longest) window, unless that window alone is longer, and the cuts
    minimise the padded tokens plus `overhead` per forward pass (a forward's fixed cost in tokens: SmolLM2 on a
    2-core CPU takes about 25 ms + 1 ms per 1,450 tokens), by dynamic programming over the cut points."""
    n = len(lengths)
    cost, cut = [0.0] * (n + 1), [n] * (n + 1)  # cost[i]: the cheapest way to run windows i..n-1
    for i in range(n - 1, -1, -1):
        size = max(1, most // max(lengths[i], 1))
        cost[i], cut[i] = min((cost[j] + (j - i) * lengths[i] + overhead, j)
                              for j in range(i + 1, min(n, i + size) + 1))
    spans, i = [], 0
    while i < n:
        spans.append((i, cut[i]))
        i = cut[i]
    return spans


def capture_for(points: Sequence[HookPoint]) -> Capture:
    """What a run must record for `points` to be read: the residual writes (any residual site), each sublayer
    field the points read, the norm scales of standardized points; no final norm scale."""
    capture = Capture.of([p.site for p in points], final_norm_scale=False)
    fields = {part: set(capture.fields(part)) for part in ("attn", "mlp", "cross")}
    for point in points:
        if point.standardized:
            fields[point.site.part].add("norm_scale")
    return Capture(attn=fields["attn"], mlp=fields["mlp"], cross=fields["cross"], final_norm_scale=False)
