"""Fitting a Jacobian lens (J-lens; Gurnee et al. 2026, "Verbalizable Representations Form a Global Workspace in
Language Models"): per residual site s, the expected Jacobian of the final residual with respect to the residual at s,

    J_s = E_window[ 1/|V| sum_{t in V} sum_{t' in V, t' >= t} d h_final[t'] / d h_s[t] ]        [d_model d_model]

with V the window's valid positions: all but the first `skip_first` (attention sinks, whose residuals are atypical)
and the last (it has no next token). A source position's effect on every later valid target position is summed,
source positions are averaged, and every window counts once. This is the estimator of Anthropic's reference
implementation and of TransformerLens 4.3 (`JacobianLens.fit`: source = a block's output, target = the last block's
output before the final norm, skip_first 16 by default); their files hold J for resid_post of layers 0..L-2. resid
fits any residual site before the final one (site_list(model, every)[:-1]), the embeddings included.

How it is computed, per forward batch of windows (one chunk):
    1. one forward pass with a zero tensor added at every source site (a Hook: an edit of the one forward), whose
       gradient is the gradient with respect to that site's residual, and the final residual (before the final
       norm) taken as the last layer leaves it (a Hook that edits nothing): the target;
    2. one backward pass per block of `block` output dimensions i: the cotangent is one at dimension i of every
       valid target position of every window, so by causality the gradient at source position t is the sum over
       t' >= t (nothing is masked), and windows are independent rows of the batch, so one backward serves them
       all. A block of k dimensions replicates the batch k times in the forward (TransformerLens's dim_batch);
    3. the gradients at the valid source positions, in float32, averaged over positions and summed over windows:
       rows i of every site's sum.
A backward pass gives the rows of every source site at once; a forward-mode (Jacobian-vector) formulation would need
one pass per site and input dimension, L/2 times the work on an L-layer model, so the fit is backward-only
(benchmarks/bench_jlens.py measures the block size). Its cost is the d_model backward passes themselves: profiled on
SmolLM2 (one CPU thread), the matmuls take ~63% of the time, attention ~10%, the cotangents, float32 sums and
zero probes a few %; batching the cotangents instead (autograd.grad(is_grads_batched=True), no replicated forward)
and SDPA's math backend instead of its flash kernel measured the same within noise.

The fit is a step job of resid's step driver (resid.analyses.distributed.steps): each step adds one batch's float32
sums into the running sum; with Execution(out=DIR) a checkpoint (the sum and the windows done) is written every
Execution.checkpoint_every steps and a rerun resumes it; the batches can run on Ray workers. The model runs in its
own dtype (gradients included); every sum is float32.
"""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from jaxtyping import Int
from torch import Tensor

from resid.analyses.distributed.execution import Execution, as_execution
from resid.analyses.distributed.executor import Job
from resid.analyses.distributed.steps import StepJob, drive_steps
from resid.analyses.io.checkpoints import DamagedState, count, expect
from resid.analyses.lenses import data
from resid.analyses.lenses.lens import JacobianLens, in_stream, site_list
from resid.capture import Capture
from resid.errors import ResidError
from resid.interventions import Hook
from resid.model import Transformer
from resid.sites import Site

SKIP_FIRST = 16  # the reference's default: leading positions left out of the average
FORWARD_TOKENS = 2048  # tokens per forward batch when Execution.batch_size is "auto"


def fit_jacobian(
    model: Transformer,
    texts: Sequence[str] | Int[Tensor, "window seq_len"],
    sites: Sequence[Site] | None = None,
    every: str = "layer",
    seq_len: int = 128,
    max_windows: int | None = None,
    skip_first: int = SKIP_FIRST,
    block: int = 1,
    execution: Execution | None = None,
) -> JacobianLens:
    """The J-lens of `model` fitted on `texts` (documents, packed into windows of seq_len tokens as for the tuned
    lens, resid.analyses.lenses.data.pack; at most max_windows) or on ready windows of token ids [window seq_len].

    sites: the residual sites to fit (default: every site of site_list(model, every) but the final one).
    skip_first: leading positions of a window left out of the source average (and of the targets).
    block: output dimensions per backward pass (the batch is replicated `block` times in the forward).
    execution: `batch_size` windows per forward pass ("auto": FORWARD_TOKENS tokens' worth), `out` a folder for the
    checkpoint (resumed when there) every `checkpoint_every` steps, `executor` / `workers`, `progress`."""
    execution = as_execution(execution)
    job = JacobianJob(model, texts, sites, every, seq_len, max_windows, skip_first, block, execution.batch_size)
    return drive_steps(model, job, execution)


def window_sums(
    model: Transformer, ids: Int[Tensor, "window seq"], sites: Sequence[Site], skip_first: int, block: int
) -> Tensor:
    """The sum over the windows of each window's J estimate (the module docstring's steps 1-3), float32
    [site d_model d_model] on the model's device."""
    d_model, n_layers = model.config.d_model, model.config.n_layers
    windows, seq = ids.shape
    valid = torch.arange(skip_first, seq - 1, device=model.device)
    replicated = ids.to(model.device).repeat(block, 1)  # replica r of every window carries output dimension i0 + r
    deltas = [torch.zeros(len(replicated), seq, d_model, dtype=model.dtype, device=model.device, requires_grad=True)
              for _ in sites]
    hooks = [Hook(site, lambda resid, tokens, delta=delta: resid + delta) for site, delta in zip(sites, deltas)]
    final: list[Tensor] = []  # the final residual before the final norm, as the last layer leaves it
    hooks.append(Hook(Site(n_layers - 1, "resid_post"), lambda resid, tokens: final.append(resid) or resid))
    with torch.enable_grad():
        model.run(replicated, capture=Capture.none(), interventions=hooks, grad=True, logits_at="last")
    target = final[0]
    sums = torch.zeros(len(sites), d_model, d_model, dtype=torch.float32, device=model.device)
    cotangent = torch.zeros_like(target).view(block, windows, seq, d_model)
    replica = torch.arange(block, device=model.device)
    passes = -(-d_model // block)
    for p in range(passes):
        first = p * block
        n = min(block, d_model - first)
        cotangent.zero_()
        cotangent[replica[:n, None], :, valid[None, :], first + replica[:n, None]] = 1.0
        grads = torch.autograd.grad(target, deltas, cotangent.view_as(target), retain_graph=p < passes - 1)
        for s, grad in enumerate(grads):
            rows = grad.view(block, windows, seq, d_model)[:n, :, valid].float()  # [dim window valid d_model]
            sums[s, first:first + n] = rows.mean(2).sum(1)
    return sums


@dataclass
class JacobianFeed(Job):
    """One chunk of a J-lens fit as plain data: a forward batch of windows [window seq] of token ids; its result the
    float32 sums over those windows of every site's J estimate [site d_model d_model] (on the CPU when it travels
    from a worker)."""

    sites: tuple[Site, ...]
    skip_first: int
    block: int
    remote: bool

    name = "J-lens batch"

    def setup(self, model: Transformer) -> Transformer:
        return model

    def run(self, model: Transformer, ids: Tensor) -> Iterator[Tensor]:
        sums = window_sums(model, ids, self.sites, self.skip_first, self.block)
        yield sums.cpu() if self.remote else sums

    def combine(self, pieces: list) -> Tensor:
        return pieces[0]


class JacobianJob(StepJob):
    """A J-lens fit as a step job: the state is the float32 running sum [site d_model d_model] and the windows
    added into it; one step is one forward batch of windows."""

    name = "J-lens"
    unit = "tok"
    kind = "resid.jacobian_lens.checkpoint"
    what = "J-lens"

    def __init__(self, model: Transformer, texts: Sequence[str] | Tensor, sites: Sequence[Site] | None, every: str,
                 seq_len: int, max_windows: int | None, skip_first: int, block: int, batch_size: int | str):
        if not isinstance(model, Transformer):
            raise ResidError(f"A J-lens is fitted on a decoder-only resid.Transformer, got {type(model).__name__}.")
        for name, value, least in (("skip_first", skip_first, 0), ("block", block, 1), ("seq_len", seq_len, 2)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ResidError(f"{name} must be a whole number of at least {least}, got {value!r}.")
        self.model = model
        final = Site(model.config.n_layers - 1, "resid_post")
        self.sites = tuple(site_list(model, every)[:-1] if sites is None else sites)
        bad = [str(s) for s in self.sites if not isinstance(s, Site) or not in_stream(model, s) or s == final]
        if bad or not self.sites:
            raise ResidError(f"A J-lens is fitted at residual sites before the final one of {model.name} (e.g. "
                             f"{site_list(model, every)[1].label}); got {bad or 'none'}.")
        windows = texts if isinstance(texts, Tensor) else data.pack(model, texts, seq_len, max_windows)
        if max_windows is not None:
            windows = windows[:max_windows]
        if windows.ndim != 2 or len(windows) == 0:
            raise ResidError(f"The J-lens is fitted on windows of token ids [window seq_len]; got "
                             f"{list(windows.shape)}: give more text, or windows.")
        if windows.shape[1] <= skip_first + 1:
            raise ResidError(f"Windows of {windows.shape[1]} tokens have no position left after skip_first="
                             f"{skip_first} and the last: use longer windows (seq_len) or a smaller skip_first.")
        self.windows, self.skip_first, self.block = windows, skip_first, block
        size = max(1, FORWARD_TOKENS // (windows.shape[1] * block)) if batch_size == "auto" else batch_size
        self.batches = [(first, min(first + size, len(windows))) for first in range(0, len(windows), size)]
        self.steps, self.step_size = len(self.batches), size * windows.shape[1]
        self._settings = {"model": model.name, "sites": [s.label for s in self.sites], "skip_first": skip_first,
                          "batch_size": size, "data": data.packed_fingerprint(windows)}
        self._load(0, torch.zeros(len(self.sites), model.config.d_model, model.config.d_model), 0)

    def _load(self, step: int, total: Tensor, windows_done: int) -> None:
        self.step, self.total, self.windows_done = step, total.to(self.model.device, torch.float32), windows_done

    def settings(self) -> dict:
        return self._settings

    def restore(self, tensors: dict[str, Tensor], metadata: dict[str, str]) -> None:
        step = count(metadata, "step", self.steps)
        total = expect(tensors, "jacobian_sum", self.total.cpu())
        extra = sorted(set(tensors) - {"jacobian_sum"})
        if extra:
            raise DamagedState(f"it has tensors a J-lens fit does not ({', '.join(extra[:4])})")
        self._load(step, total, sum(b - a for a, b in self.batches[:step]))

    def state(self) -> tuple[dict[str, Tensor], dict[str, str]]:
        if not bool(self.total.isfinite().all()):
            raise ResidError(self._not_finite())
        return {"jacobian_sum": self.total.cpu()}, {"step": str(self.step)}

    def _not_finite(self) -> str:
        bad = (~self.total.isfinite()).flatten(1).any(1).nonzero()
        site = self.sites[int(bad[0])].label if len(bad) else "?"
        return (f"The J-lens fit's sum at {site} is not finite (NaN or infinite) after {self.step} batches: the "
                "model's gradients overflow in its dtype; fit it in float32 (dtype=torch.float32 when loading).")

    def feed(self, remote: bool) -> JacobianFeed:
        return JacobianFeed(self.sites, self.skip_first, self.block, remote)

    def chunks(self) -> Iterator[Tensor]:
        for first, last in self.batches[self.step:]:
            yield self.windows[first:last]

    def consume(self, result: Tensor) -> Iterator[dict[str, str]]:
        first, last = self.batches[self.step]
        self.total += result.to(self.total.device)
        self.step, self.windows_done = self.step + 1, self.windows_done + last - first
        yield {"windows": str(self.windows_done)}

    def finish(self, out: Path | None) -> JacobianLens:
        if not bool(self.total.isfinite().all()):
            raise ResidError(self._not_finite())
        info = {"model": self.model.name, "windows": self.windows_done, "seq_len": int(self.windows.shape[1]),
                "skip_first": self.skip_first, "data": self._settings["data"], "estimator": "jacobian_lens"}
        return JacobianLens(self.model, self.sites, (self.total / self.windows_done).cpu(), info)

