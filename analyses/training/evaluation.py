"""How good a dictionary is, on a corpus, as SAELens's and sparsify's evaluations measure it. (Sets of transcoders
replacing every MLP at once, with the scores of the graphs they give: resid.analyses.training.replacements.)

    df = evaluate(model, [sae, transcoder], corpus.demo(max_documents=200))
    df = evaluate(model, saes, texts, execution=Execution(executor="ray", workers=2))   # the same table

Per dictionary, over the evaluation tokens (padding and, unless keep_bos, each window's first position excluded, as
in training: resid.analyses.training.activations.training_positions):

    fvu                 fraction of variance unexplained: sum |y - y^|^2 / sum |y - mean(y)|^2 (mean over the tokens)
    l0                  mean number of active features per token
    dead_fraction       features that never fire on these tokens
    dense_fraction      features that fire on more than `dense` (default 10%) of them
    ce_clean            next-token cross-entropy of the model (nats), at the positions whose prediction is scored
    ce_spliced          ... with the tensor the dictionary reconstructs replaced by the reconstruction alone
                        (resid.dictionaries.Splice(d, error=False)), at every position of the pass
    ce_zero_ablated     ... with that tensor replaced by zeros (a splice of the dictionary with a zero decoder)
    ce_loss_recovered   1 - (ce_spliced - ce_clean) / (ce_zero_ablated - ce_clean)
    kl_spliced          KL(clean || spliced) of the next-token distributions, mean over the scored positions

Tokens whose target norm exceeds max_norm_ratio x the batch's median (attention sinks past the first position) are
left out of these sums and keep their tensor in the spliced runs, as training leaves them out.

A prediction is scored at a training position (real, not a window's first unless keep_bos) whose next token is real.
The spliced and zero-ablated runs replace the training positions only: the first position (BOS or, in a model that
prepends none, the attention sink) and padding keep the model's own tensor
(resid.analyses.training.splice says why). splice_bos=True splices every position with
resid.dictionaries.Splice(d, error=False), as SAELens's evaluation does.

Besides the metrics, each row names the dictionary's `site` (the Site label of what it reconstructs or predicts) and
`site_in` (what it reads). The evaluation is a reduction of the driver (resid.analyses.distributed.driver.drive):
each chunk is a forward batch of windows (Execution.batch_size of them; "auto": BATCH_SIZE), its result every
dictionary's sums over it, added up in chunk order, so the table is the same in process and on any number of Ray
workers (one model each).
"""

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor

from resid.analyses.corpus_windows import Window, batch_tokens, cut_windows
from resid.analyses.distributed.driver import drive
from resid.analyses.distributed.execution import Execution, as_execution
from resid.analyses.distributed.executor import Job
from resid.analyses.io import corpus as corpora
from resid.analyses.io.provenance import describe
from resid.analyses.training.activations import check_ratio, ordinary, training_positions
from resid.analyses.training.splice import splice_at
from resid.dictionaries import Dictionary, Splice, check
from resid.dictionaries.check import on_device
from resid.errors import ResidError
from resid.model import Transformer

BATCH_SIZE = 4  # windows per forward pass when Execution.batch_size is "auto"


def evaluate(
    model: Transformer,
    dictionaries: Dictionary | Sequence[Dictionary],
    corpus: corpora.Source,
    max_windows: int = 64,
    window: int = 128,
    keep_bos: bool = False,
    dense: float = 0.1,
    splice_bos: bool = False,
    max_norm_ratio: float | None = 10.0,
    execution: Execution | None = None,
) -> pd.DataFrame:
    """One row per dictionary (see the module docstring), over the first `max_windows` windows of `corpus`.
    execution: how the job runs (resid.analyses.Execution): `batch_size` windows per forward pass ("auto":
    BATCH_SIZE), `executor` / `workers`, `progress`."""
    execution = as_execution(execution)
    dictionaries = [dictionaries] if isinstance(dictionaries, Dictionary) else list(dictionaries)
    if not dictionaries:
        raise ResidError("Give at least one dictionary to evaluate.")
    if not 0 < dense < 1:
        raise ResidError(f"dense must be a fraction between 0 and 1, got {dense!r}.")
    dictionaries = [check(d, model) for d in dictionaries]
    check_ratio(max_norm_ratio)
    pieces, batches = window_batches(model, corpus, window, max_windows, execution)
    job = DictionaryEvaluation(tuple(dictionaries), model.require_tokenizer().pad_token_id, keep_bos, splice_bos,
                               max_norm_ratio, batches)
    totals = drive(model, job, execution)
    df = pd.DataFrame([total.row(d, dense) for d, total in zip(dictionaries, totals)])
    df.attrs["provenance"] = describe(model, "training.evaluate", {
        "dictionaries": [d.name for d in dictionaries], "windows": len(pieces), "window": window,
        "keep_bos": keep_bos, "dense": dense, "splice_bos": splice_bos,
        "max_norm_ratio": max_norm_ratio})
    return df


def window_batches(model: Transformer, corpus: corpora.Source, window: int, max_windows: int,
                   execution: Execution) -> tuple[list[Window], list[tuple[Window, ...]]]:
    """The first `max_windows` windows of `corpus`, and their forward batches (execution.batch_size windows each;
    "auto": BATCH_SIZE)."""
    pieces = cut_windows(model, corpora.load(corpus), window)[:max_windows]
    size = BATCH_SIZE if execution.batch_size == "auto" else execution.batch_size
    return pieces, [tuple(pieces[start:start + size]) for start in range(0, len(pieces), size)]


def scored_positions(tokens, valid: Tensor) -> Tensor:
    """The positions whose next-token prediction is scored: training positions (`valid`) whose next token is
    real."""
    scored = valid.clone()
    scored[:, :-1] &= tokens.attention_mask[:, 1:]
    scored[:, -1] = False
    return scored


@dataclass
class DictionaryEvaluation(Job):
    """Per forward batch of windows (a chunk), each dictionary's Totals over it; `finish` adds them up in chunk
    order."""

    dictionaries: tuple[Dictionary, ...]  # checked against the model (their hook points resolved)
    pad: int
    keep_bos: bool
    splice_bos: bool
    max_norm_ratio: float | None
    batches: list  # tuples of windows, planned on the driver (they travel with their chunks)

    name = "dictionary eval"
    unit = "tok"

    def plan(self, done: set, workers: int | None, per_worker: int) -> list[tuple[Window, ...]]:
        planned, self.batches = self.batches, []
        return planned

    def size(self, batch: tuple[Window, ...]) -> int:
        return sum(len(w) for w in batch)

    def setup(self, model: Transformer) -> tuple:
        dictionaries = on_device(self.dictionaries, model)
        return model, dictionaries, [_zeroed(d) for d in dictionaries]

    @torch.no_grad()
    def run(self, state: tuple, batch: tuple[Window, ...]) -> Iterator[list["Totals"]]:
        model, dictionaries, zeros = state
        totals = [Totals(d.d_out, d.d_sae) for d in dictionaries]
        tokens = batch_tokens(batch, self.pad, model.device)[0]
        valid = training_positions(tokens, self.keep_bos)
        scored = scored_positions(tokens, valid)
        clean = model.run(tokens, dictionaries=dictionaries)
        clean_logp = torch.log_softmax(clean.logits[scored].float(), dim=-1)
        targets = tokens.ids[:, 1:][scored[:, :-1]]
        for d, zero, total in zip(dictionaries, zeros, totals):
            record = clean.dictionaries[d.name]
            where = trained_on(record, valid, self.max_norm_ratio)
            total.observe(record, where)
            total.ce_clean += nll(clean_logp, targets)
            if self.splice_bos:
                spliced = model.run(tokens, dictionaries=[Splice(d, error=False)]).logits
                zeroed = model.run(tokens, dictionaries=[Splice(zero, error=False)]).logits
            else:
                spliced = model.run(tokens, interventions=splice_at(model, d, where)).logits
                zeroed = model.run(tokens, interventions=splice_at(model, d, where, zero=True)).logits
            spliced = torch.log_softmax(spliced[scored].float(), dim=-1)
            total.ce_spliced += nll(spliced, targets)
            total.kl += float((clean_logp.exp() * (clean_logp - spliced)).sum())
            total.ce_zero += nll(torch.log_softmax(zeroed[scored].float(), dim=-1), targets)
            total.scored += len(targets)
        yield totals

    def combine(self, pieces: list) -> list["Totals"]:
        return pieces[0]

    def finish(self, results: list[list["Totals"]]) -> list["Totals"]:
        merged = [Totals(d.d_out, d.d_sae) for d in self.dictionaries]
        for totals in results:  # in chunk order: float64 sums that do not depend on who finished first
            for into, part in zip(merged, totals):
                into.add(part)
        return merged


def _zeroed(d: Dictionary) -> Dictionary:
    """A copy of d with the same hooks, reconstructing zeros: the zero ablation as a splice."""
    zero = copy.deepcopy(d)
    zero.name = f"{d.name}/zero"
    with torch.no_grad():
        for field in ("W_dec", "b_dec", "W_skip"):
            if getattr(zero, field) is not None:
                getattr(zero, field).zero_()
    return zero


def trained_on(record, valid: Tensor, ratio: float | None) -> Tensor:
    """The positions of `valid` a dictionary trains on: without those whose target's norm exceeds ratio x the
    median over `valid` (resid.analyses.training.activations.ordinary; a transcoder's input is normed, so its target
    is where such outliers show)."""
    if ratio is None or not bool(valid.any()):
        return valid
    where = valid.clone()
    where[valid] = ordinary((record.reconstruction + record.error)[valid].float().norm(dim=-1), ratio)
    return where


def nll(logp: Tensor, targets: Tensor) -> float:
    return float(-logp.gather(-1, targets[:, None]).sum())


class Totals:
    """Running sums of one dictionary over evaluation batches (float64), merged with `add`."""

    FLOATS = ("error", "square", "active", "ce_clean", "ce_spliced", "ce_zero", "kl")

    def __init__(self, d_out: int, d_sae: int):
        self.tokens = self.scored = 0
        self.error = self.square = self.active = 0.0
        self.ce_clean = self.ce_spliced = self.ce_zero = self.kl = 0.0
        self.sum = torch.zeros(d_out, dtype=torch.float64)
        self.fired = torch.zeros(d_sae, dtype=torch.float64)

    def observe(self, record, valid: Tensor) -> None:
        target = (record.reconstruction + record.error)[valid].double()
        acts = record.acts.to_dense() if record.acts.is_sparse else record.acts
        on = acts[valid] > 0
        self.tokens += len(target)
        self.error += float(record.error[valid].double().pow(2).sum())
        self.square += float(target.pow(2).sum())
        self.sum += target.sum(0).cpu()
        self.active += float(on.sum())
        self.fired += on.sum(0).double().cpu()

    def add(self, other: "Totals") -> None:
        self.tokens += other.tokens
        self.scored += other.scored
        for name in self.FLOATS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.sum += other.sum
        self.fired += other.fired

    def row(self, d: Dictionary, dense: float) -> dict:
        return {"dictionary": d.name, "site": d.site_out.label, "site_in": d.site_in.label, "d_sae": d.d_sae,
                **self.metrics(dense)}

    def metrics(self, dense: float) -> dict:
        """tokens, fvu, l0, dead and dense fractions, the cross-entropies, CE loss recovered and KL."""
        n = max(self.tokens, 1)
        variance = self.square - float(self.sum.pow(2).sum()) / n
        ce = {name: value / max(self.scored, 1) for name, value in
              (("ce_clean", self.ce_clean), ("ce_spliced", self.ce_spliced), ("ce_zero_ablated", self.ce_zero))}
        gap = ce["ce_zero_ablated"] - ce["ce_clean"]
        return {
            "tokens": self.tokens, "fvu": self.error / variance if variance > 0 else float("nan"),
            "l0": self.active / n, "dead_fraction": float((self.fired == 0).double().mean()),
            "dense_fraction": float((self.fired > dense * n).double().mean()), **ce,
            "ce_loss_recovered": 1 - (ce["ce_spliced"] - ce["ce_clean"]) / gap if gap != 0 else float("nan"),
            "kl_spliced": self.kl / max(self.scored, 1),
        }
