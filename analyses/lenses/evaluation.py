"""Lenses evaluated site by site on held-out text, as tuned-lens's `tuned-lens eval` does (scripts/eval_loop.py).

    df = evaluate(model, held_out, [tuned])        # the logit lens, then each lens given, at every site
    df.pivot(index="layer", columns="lens", values="kl")

One row per (lens, site) with the means over the evaluated tokens, in nats:
    ce        cross-entropy of the lens's distribution with the next token (every position but a window's last)
    kl        KL(final || lens): the model's own distribution against the lens's
    entropy   the lens's entropy
    top1      the fraction of tokens whose top token under the lens is the model's final top token
plus `layer`, `site` (the resid.Site label, "layers[3].resid_post", as in the logit lens's table), `tokens` (tokens
averaged over) and `label` (short, for plots: "embed", "L3 post", ...). The last site is the model itself for
every lens (kl 0, top1 1): its ce and entropy are the model's. The text is packed into windows as for training
(resid.analyses.lenses.data.pack); everything is float32, as tuned-lens evaluates on a CPU.

The evaluation is a reduction of the driver (resid.analyses.distributed.driver.drive): each chunk is a forward batch
of windows (Execution.batch_size of them), its result the float64 sums of every metric per lens and site, added up in
chunk order, so the table is the same in process and on any number of Ray workers (one model each).
"""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Int
from torch import Tensor

from resid.analyses.distributed.driver import drive
from resid.analyses.distributed.execution import Execution, as_execution
from resid.analyses.distributed.executor import Job
from resid.analyses.io import provenance
from resid.analyses.lenses import data
from resid.analyses.lenses.kl import final_distribution, statistics
from resid.analyses.lenses.lens import Lens, LogitLens, short_label, site_list
from resid.capture import Capture
from resid.errors import ResidError
from resid.model import Transformer

METRICS = ("ce", "kl", "entropy", "top1")
COLUMNS = ("lens", "layer", "site", "label", "tokens", *METRICS)
CHUNK_ELEMENTS = 2**24  # logits per readout call ([chunk d_vocab] float32: 64 MiB)
FORWARD_TOKENS = 2048  # tokens per forward pass when Execution.batch_size is "auto"


def evaluate(
    model: Transformer,
    texts: Sequence[str] | Int[Tensor, "window seq_len"],
    lenses: Sequence[Lens] = (),
    every: str = "layer",
    seq_len: int = 512,
    max_tokens: int | None = None,
    execution: Execution | None = None,
) -> pd.DataFrame:
    """The logit lens and each of `lenses` at every site of ResidualStream.running(every) on `texts` (documents,
    packed into windows of seq_len, at most max_tokens tokens) or on ready windows of token ids; the columns of
    COLUMNS. execution: how the job runs (resid.analyses.Execution): `batch_size` windows per forward pass ("auto":
    FORWARD_TOKENS tokens' worth), `executor` / `workers`, `progress`."""
    execution = as_execution(execution)
    readers = [LogitLens(model), *lenses]
    for reader in readers:
        reader.check(model, every)
    names = [reader.name for reader in readers]
    if len(set(names)) != len(names):
        raise ResidError(f"The lenses have names {names}: evaluate one lens of each kind at a time.")
    unknown = [type(lens).__name__ for lens in lenses if not isinstance(lens, Lens) or isinstance(lens, LogitLens)]
    if unknown:
        raise ResidError(f"evaluate compares lenses with the logit lens, which it always reads; got "
                         f"{', '.join(unknown)}: pass TunedLens or JacobianLens objects (or none).")
    max_windows = None if max_tokens is None else max(1, max_tokens // seq_len)
    windows = texts if isinstance(texts, Tensor) else data.pack(model, texts, seq_len, max_windows)
    if max_windows is not None:
        windows = windows[:max_windows]
    if len(windows) == 0:
        raise ResidError("There are no windows to evaluate the lenses on: give some text or windows of token ids.")
    size = max(1, FORWARD_TOKENS // windows.shape[1]) if execution.batch_size == "auto" else execution.batch_size
    batches = [windows[first:first + size] for first in range(0, len(windows), size)]
    sums = drive(model, LensEvaluation(tuple(lens.remake() for lens in lenses), every, batches), execution)
    sites = site_list(model, every)
    rows = []
    for r, reader in enumerate(readers):
        for s, site in enumerate(sites):
            total = sums[r, s]
            means = {metric: float(total[m] / (total[-1] if metric == "ce" else total[-2]))
                     for m, metric in enumerate(METRICS)}
            rows.append({"lens": reader.name, "layer": site.layer, "site": site.label, "label": short_label(site),
                         "tokens": int(total[-2]), **means})
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    parameters = {"lenses": names, "every": every, "seq_len": int(windows.shape[1]), "windows": len(windows),
                  "data": data.packed_fingerprint(windows)}
    df.attrs["provenance"] = provenance.describe(model, "tuned_lens.evaluate", parameters)
    return df


@dataclass
class LensEvaluation(Job):
    """Per forward batch of windows (a chunk: [window seq] token ids), the float64 sums of every metric, the tokens
    and the tokens with a next-token label, per reader (the logit lens, then each lens, made again on the worker's
    model by Lens.remake) and site: [reader site metric+2]; `finish` adds them up in chunk order."""

    lenses: tuple  # Lens.remake() of each lens: model -> the lens
    every: str
    batches: list  # the windows in forward batches, planned on the driver (they travel with their chunks)

    name = "lens eval"
    unit = "tok"

    def plan(self, done: set, workers: int | None, per_worker: int) -> list[Tensor]:
        planned, self.batches = self.batches, []
        return planned

    def size(self, ids: Tensor) -> int:
        return ids.numel()

    def setup(self, model: Transformer) -> tuple:
        readers = [LogitLens(model), *(remake(model) for remake in self.lenses)]
        return model, readers, site_list(model, self.every), max(1, CHUNK_ELEMENTS // model.config.d_vocab)

    @torch.no_grad()
    def run(self, state: tuple, ids: Tensor) -> Iterator[Tensor]:
        model, readers, sites, chunk = state
        sums = torch.zeros(len(readers), len(sites), len(METRICS) + 2, dtype=torch.float64)  # metrics, tokens, labels
        ids = ids.to(model.device)
        frozen = any(reader.frozen_norm for reader in readers)
        run = model.run(ids, capture=Capture(final_norm_scale=frozen))
        final = run.logits.flatten(0, 1)
        scale = run.stream.final_norm_scale.flatten(0, 1) if frozen else None
        resids = [resid.flatten(0, 1) for _, resid in run.stream.running(self.every)]
        labels = torch.roll(ids, -1, dims=1).flatten()  # the next token; a window's last position has none
        has_label = (torch.arange(ids.shape[1], device=ids.device) < ids.shape[1] - 1).expand_as(ids).flatten()
        for at in range(0, final.shape[0], chunk):
            piece = slice(at, at + chunk)
            p, neg_entropy = final_distribution(final[piece])
            top = final[piece].argmax(-1)
            for s, site in enumerate(sites):
                for r, reader in enumerate(readers):
                    if r > 0 and reader.is_final(site):  # every lens is the model there: read it once
                        sums[r, s] = sums[0, s]
                        continue
                    logits = reader.logits(resids[s][piece], site, None if scale is None else scale[piece])
                    stats = statistics(logits, p, neg_entropy, top, labels[piece], has_label[piece], overwrite=True)
                    for m, metric in enumerate(METRICS):
                        sums[r, s, m] += stats[metric].nansum().double().cpu()
                    sums[r, s, -2] += len(p)
                    sums[r, s, -1] += has_label[piece].sum().cpu()
        yield sums

    def combine(self, pieces: list) -> Tensor:
        return pieces[0]

    def finish(self, results: list[Tensor]) -> Tensor:
        total = torch.zeros_like(results[0])
        for sums in results:  # in chunk order: float64 sums that do not depend on who finished first
            total += sums
        return total
