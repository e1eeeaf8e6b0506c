"""Batched (prompt x site) rows: what one chunk of a sweep (or of exact patching) computes, on whichever worker
runs it.

A *group* is a few prompts run clean together (their donors appended: resample ablation, patching); its rows are
then ablated layer by layer, each resumed from the clean residual entering the ablated site's layer
(model.resume), unembedding only the last token (or each prompt's [MASK]). A row's site is replaced by zero, by
its mean over reference text, or by its value in the donor run; residual sites (resid_pre / resid_mid /
resid_post at some positions) are replaced at each row's own positions, which an alignment may map to other
positions in the donor (patching pairs of different lengths). Every function here takes plain inputs (token ids,
global prompt indices) so that a remote worker computes exactly what the driver would.

Nothing inside a group asks the device for a value: where positions sit in the padded batches is known on the host
from the token ids (Layout), each edit's rows and positions become index tensors once, and the rows' metrics stay on
the device until the group's last layer, then come to the host in one transfer (on a GPU, every value read back
waits for all the work queued before it).
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from resid.analyses.metrics import check_metric, metric_values
from resid.analyses.site_words import columns
from resid.analyses.sweeps.seq2seq import SourceIds, plain, resume_encoder
from resid.batching import BatchSize, run_batched
from resid.capture import Capture
from resid.config import ModelConfig
from resid.dictionaries import feature_edits
from resid.interventions import Add, Scale
from resid.model import Memory, Run, Transformer
from resid.selection import Padded
from resid.seq2seq import EncoderDecoder
from resid.sites import RESID_PARTS, Site
from resid.tokenizer import Tokens


@dataclass
class Context:
    model: Transformer
    method: str
    metric: str | Callable  # a name of resid.analyses.metrics.METRICS, or a function of the logits
    means: dict  # Site (whole) -> mean tensor on the model's device
    per_position: bool
    size: BatchSize  # rows per forward pass, shared so an out-of-memory halving sticks
    read_at: list[int] | None = None  # masked-LM models: each prompt's [MASK] (None: each prompt's last token)
    # patching pairs of different lengths: per prompt, {position named in the table: (its base position, the
    # donor's position)}, prompt-relative (None: every position is itself in both)
    aligned: list[dict[int, tuple[int, int]]] | None = None
    donor_metric: bool = False  # rows carry the donor run's metric too (patching)
    dictionaries: tuple = ()  # learned dictionaries whose features are ablated (Site(..., feature=i))
    encoder: Transformer | None = None  # encoder-decoder models: the encoder (`model` is then the decoder)


@dataclass
class Group:
    """One group of prompts after its clean pass."""

    prompts: list[int]  # global prompt indices; row i of the tensors below is prompts[i]
    tokens: Tokens  # the group's prompts, on the model's device
    clean: Run  # the clean run (donor rows appended after the prompts when there are donors)
    donors: Tokens | None  # the donor rows' tokens
    targets: Tensor
    baselines: Tensor | None
    clean_metric: Tensor
    donor_metric: Tensor | None
    layout: "Layout"  # the clean pass's padded batch, on the host (prompts then donors)
    at: Tensor | None = None  # masked-LM models: [k 1] padded index of each prompt's [MASK]
    encoded: Run | None = None  # encoder-decoder models: the sources' clean encoder run (donors' appended)
    sources: Tokens | None = None  # the group's prompts' sources
    donor_sources: Tokens | None = None
    source_layout: "Layout | None" = None  # the sources' padded batch, on the host

    def side(self, site: Site) -> tuple[Run, Tokens, "Layout"]:
        """(the clean run, the prompts' tokens, the host layout of its padded batch) of the stack a site is on."""
        if site.stack == "encoder":
            return self.encoded, self.sources, self.source_layout
        return self.clean, self.tokens, self.layout

    def memory(self, index: Tensor) -> Memory | None:
        """The clean encoded sources of these rows (None without an encoder)."""
        if self.encoded is None:
            return None
        return Memory(self.encoded.hidden[index], self.encoded.tokens.attention_mask[index])


@dataclass(frozen=True)
class Layout:
    """Where prompt-relative positions sit in a left-padded batch, known on the host from the token ids that built
    it (Tokens.pad): the edits of a batch of rows are indexed without asking the device for the lengths."""

    lengths: list[int]  # each row's real token count, in the batch's order (prompts, then donors)
    width: int  # the batch's padded width

    @classmethod
    def of(cls, sequences: list) -> "Layout":
        lengths = [len(ids) for ids in sequences]
        return cls(lengths, max(lengths))

    def column(self, row: int, position: int) -> int:
        """The padded index of prompt-relative `position` (negative: from the end) in batch row `row`."""
        n = self.lengths[row]
        return self.width - n + position % n


def clean_pass(ctx: Context, sequences: list, pad: int, group: list, todo: list, target_ids: list,
               baseline_ids: list | None, donors: list | None, sources: SourceIds | None = None) -> Group:
    """The group's prompts (then their donors, if any) in one clean run. sequences: every prompt's real token ids;
    donors: per prompt, a prompt index or the donor's token ids; sources: encoder-decoder models' sources."""
    model = ctx.model
    encoded = None
    if sources is not None:  # encoder-decoder models: the sources (then the donors') through the encoder
        wanted = {plain(edit.whole) for _, site in todo for edit in edited(site, model.config) if edit.stack}
        source_ids = sources.of(group, donors)
        encoded = ctx.encoder.run(Tokens.pad(source_ids, sources.pad), capture=Capture.of(wanted))
    chosen = [sequences[p] for p in group]
    if donors is not None:
        chosen += [sequences[d] if isinstance(d, int) else d for d in (donors[p] for p in group)]
    capture = Capture.of({edit.whole for _, site in todo for edit in edited(site, model.config) if edit.stack is None})
    padded, layout = Tokens.pad(chosen, pad), Layout.of(chosen)
    k = len(group)
    at = None
    if ctx.read_at is not None:  # donors (same lengths) are read where their prompt is
        at = torch.tensor([[layout.column(i, ctx.read_at[group[i % k]])] for i in range(len(chosen))],
                          device=model.device)
    clean = model.run(padded, capture=capture, logits_at="last" if at is None else Padded(at),
                      memory=None if encoded is None else EncoderDecoder.memory(encoded),
                      dictionaries=ctx.dictionaries)
    tokens = clean.tokens  # on the model's device, like every index built from it below
    targets = torch.tensor([target_ids[p] for p in group], device=model.device)
    baselines = None if baseline_ids is None else torch.tensor([baseline_ids[p] for p in group], device=model.device)
    metric = metric_values(ctx.metric, clean.logits[:, 0], targets.repeat(len(chosen) // k),
                           None if baselines is None else baselines.repeat(len(chosen) // k))
    return Group(
        prompts=group,
        tokens=tokens.rows(torch.arange(k)) if donors is not None else tokens,
        clean=clean,
        donors=tokens.rows(torch.arange(k, 2 * k)) if donors is not None else None,
        targets=targets,
        baselines=baselines,
        clean_metric=metric[:k],
        donor_metric=metric[k:] if donors is not None else None,
        layout=layout,
        at=None if ctx.read_at is None else at[:k],
        encoded=encoded,
        sources=None if encoded is None else encoded.tokens.rows(torch.arange(k)),
        donor_sources=None if encoded is None or donors is None else encoded.tokens.rows(torch.arange(k, 2 * k)),
        source_layout=None if encoded is None else Layout.of(source_ids),
    )


def ablate_group(ctx: Context, group: Group, todo: list[tuple[int, Site]]) -> Iterator[pd.DataFrame]:
    """Every pending (prompt, site) row of the group, layer by layer, each resumed from the clean residual. The
    metrics stay on the device until the group's last layer: the rows come back to the host once, as one frame."""
    model, k = ctx.model, len(group.prompts)
    local = {p: i for i, p in enumerate(group.prompts)}
    by_layer: dict[int, list] = {}
    n_encoder = 0 if ctx.encoder is None else ctx.encoder.config.n_layers
    for p, site in todo:
        by_layer.setdefault(start_layer(site, n_encoder), []).append((local[p], site))
    entering = [] if group.encoded is None else [(l - n_encoder, r) for l, r in group.encoded.stream.entering()]
    done: list[tuple[int, Site]] = []
    ablated: list[Tensor] = []
    for layer, resid in [*entering, *group.clean.stream.entering()]:
        resid = resid[:k]
        if layer in by_layer:
            def work(rows, layer=layer, resid_pre=resid):
                local_rows = [i for i, _ in rows]
                index = torch.tensor(local_rows, device=model.device)
                edits = _edits(ctx, group, rows, local_rows, index)
                at = "last" if group.at is None else Padded(group.at[index])
                if layer < 0:  # an encoder layer: the encoder resumed there, then the whole decoder
                    logits = resume_encoder(ctx, group, layer + n_encoder, resid_pre[index], index, edits, at)
                else:
                    logits = model.resume(layer, resid_pre[index], group.tokens.rows(index), edits, logits_at=at,
                                          memory=group.memory(index))
                baselines = None if group.baselines is None else group.baselines[index]
                return metric_values(ctx.metric, logits[:, 0], group.targets[index], baselines)

            for rows, metrics in run_batched(by_layer[layer], work, ctx.size):
                done += rows
                ablated.append(metrics)
    if done:
        yield _frame(ctx, done, group, torch.cat(ablated))


def start_layer(site: Site, encoder_layers: int = 0) -> int:
    """The first layer whose computation a site's edit changes: a resumed run starts there. Encoder sites count
    from -encoder_layers (the encoder's first layer) to -1 (its last), before the decoder's layer 0."""
    layer = 0 if site.layer is None else site.layer
    return layer - encoder_layers if site.stack == "encoder" else layer


def _edits(ctx: Context, group: Group, rows: list[tuple[int, Site]], local: list[int], index: Tensor) -> list:
    """Per-row ablations as whole-batch edits: each site is scaled by 0 on the rows that ablate it (1 on the
    others) and, for mean / resample, its replacement is added on those rows only. Exact: x*1 + 0 = x. A
    residual site is edited whole, with each row's replacement equal to the clean residual but at its positions.
    local: each row's index in the group, on the host (`index` is the same on the device)."""
    model, edits = ctx.model, []
    by_site: dict[Site, list[int]] = {}
    for row, (_, site) in enumerate(rows):
        for edit_site in edited(site, model.config):
            by_site.setdefault(edit_site, []).append(row)
    for site, members in by_site.items():
        mask = torch.zeros(len(rows), dtype=model.dtype)
        mask[members] = 1  # built on the host, copied to the device once
        mask = mask.to(model.device)
        if site.part in RESID_PARTS and not site.of_dictionary:
            replacement = _residual(ctx, group, rows, local, members, site, index)
            shape = (-1, 1, 1)
        else:
            replacement = None if ctx.method == "zero" else _replacement(ctx, group, site, local, index)
            shape = (-1,) + (1,) * (_slice_ndim(site) - 1)
        edits.append(Scale(site, (1 - mask).view(shape)))
        if replacement is not None:
            edits.append(Add(site, replacement * mask.view(shape)))
    return feature_edits(model, ctx.dictionaries, edits) if ctx.dictionaries else edits


def edited(site: Site, config: ModelConfig) -> list[Site]:
    """The sites a row's edits act on: a layer's sublayer writes, a residual site whole (its positions are each
    row's own), any other site as it is."""
    if site.part == "layer":
        parts = ("attn", "cross", "mlp") if config.cross_attention and site.stack is None else ("attn", "mlp")
        return [Site(site.layer, part, positions=site.positions, stack=site.stack) for part in parts]
    return [site.whole] if site.part in RESID_PARTS and not site.of_dictionary else [site]


def _slice_ndim(site: Site) -> int:
    """The number of axes of the slice a site's edit sees ([batch pos] for a neuron, [batch pos d] mostly, with
    a head axis for a whole field)."""
    if site.neuron is not None or site.feature is not None:
        return 2
    return 4 if site.what in ("z", "q", "k", "v", "pattern") and site.unit is None else 3


def _replacement(ctx: Context, group: Group, site: Site, local: list[int], index: Tensor) -> Tensor:
    """[rows pos ...] the mean or donor value of a site's field, at the site's positions if it names some."""
    k = len(group.prompts)
    run, tokens, layout = group.side(site)
    tokens = tokens.rows(index)
    if ctx.method == "mean":
        value = ctx.means[site.whole]
        if ctx.per_position:
            value = value[tokens.position_ids]
    else:
        value = run.read(plain(site.whole))[index + k]
    if site.positions is not None and value.ndim >= 2 and value.shape[1] == tokens.ids.shape[1]:
        at = torch.tensor([[layout.column(row, p) for p in site.positions] for row in local], device=value.device)
        at = at.view(*at.shape, *([1] * (value.ndim - 2))).expand(-1, -1, *value.shape[2:])
        value = value.gather(1, at)
    return value


def _residual(ctx: Context, group: Group, rows: list[tuple[int, Site]], local: list[int], members: list[int],
              site: Site, index: Tensor) -> Tensor:
    """[rows pos d_model] the clean residual at `site` with each member row's positions replaced (zero, mean or
    the donor's residual at the aligned positions); other rows keep the clean residual (masked off anyway). Every
    (row, position) pair is laid out on the host and replaced in one indexed write."""
    k = len(group.prompts)
    run, _, layout = group.side(site)
    whole = run.stream.read(plain(site))  # [prompts (+ donors) pos d_model]
    value = whole[index].clone()
    at_row, at, donor_row, donor_at, relative = [], [], [], [], []
    for row in members:
        i, named = local[row], rows[row][1]
        base, donor = _aligned(ctx, group.prompts[i], named.positions) if site.stack is None else (named.positions,) * 2
        at_row += [row] * len(base)
        at += [layout.column(i, p) for p in base]
        relative += [p % layout.lengths[i] for p in base]  # the position id there (0 = the first real token)
        donor_row += [i + k] * len(donor)
        donor_at += [layout.column(i + k, p) for p in donor] if ctx.method == "resample" else []
    device = value.device
    where = (torch.tensor(at_row, device=device), torch.tensor(at, dtype=torch.long, device=device))
    if ctx.method == "zero":
        value[where] = 0
    elif ctx.method == "mean":
        mean = ctx.means[site]
        value[where] = mean[torch.tensor(relative, device=device)] if ctx.per_position else mean
    else:
        value[where] = whole[torch.tensor(donor_row, device=device), torch.tensor(donor_at, dtype=torch.long,
                                                                                  device=device)]
    return value


def _aligned(ctx: Context, prompt: int, positions: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """(base positions, donor positions) of a row's named positions."""
    if ctx.aligned is None:
        return list(positions), list(positions)
    pairs = [ctx.aligned[prompt][p] for p in positions]
    return [b for b, _ in pairs], [d for _, d in pairs]


def _frame(ctx: Context, rows: list[tuple[int, Site]], group: Group, ablated: Tensor) -> pd.DataFrame:
    """The rows' table, from one transfer of their metrics (ablated, clean, and the donor's for patching) to the
    host; the site columns are made once per distinct site and repeated by index."""
    local = torch.tensor([i for i, _ in rows], device=ablated.device)
    metrics = [ablated.float(), group.clean_metric[local].float()]
    if ctx.donor_metric:
        metrics.append(group.donor_metric[local].float())
    on_host = torch.stack(metrics).double().cpu().numpy()
    ablated, clean = on_host[0], on_host[1]
    distinct: dict[Site, int] = {}
    which = np.fromiter((distinct.setdefault(site, len(distinct)) for _, site in rows), dtype=np.int64,
                        count=len(rows))
    frame = {
        "prompt_idx": np.asarray(group.prompts, dtype=np.int64)[[i for i, _ in rows]],
        **{name: _take(column, which) for name, column in columns(list(distinct)).items()},
        "method": ctx.method,
        "metric": check_metric(ctx.metric, True),
        "clean_metric": clean,
        "ablated_metric": ablated,
        "delta": ablated - clean,
    }
    if ctx.donor_metric:
        frame["donor_metric"] = on_host[2]
    return pd.DataFrame(frame)


def _take(column, which: np.ndarray):
    """A site column (a list, or a nullable integer array) repeated to the rows (`which`: each row's site)."""
    if isinstance(column, list):
        return np.asarray(column, dtype=object)[which]
    return column.take(which)
