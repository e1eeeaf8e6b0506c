"""Path patching (Wang et al. 2022, the IOI circuit): the effect of sender heads on the answer *through* chosen
receivers only, every other path held at the base run.

With a base prompt and a donor prompt of each pair (direction="denoise", the default of every patching method:
the corrupt prompt is the base, the clean one the donor; direction="noise" is Wang et al.'s convention, the clean
prompt the base and the corrupt one the donor):

  1. run the base prompt with the senders' z (or a sender MLP's write) taken from the donor run and every other
     head's z frozen at the base run's (the other MLPs are recomputed);
  2. receivers "logits": that run's metric is the answer (the senders' direct path and their paths through MLPs);
     receivers, a list of head-input Sites (a head's q or pattern, a key/value head's k or v): record those
     inputs in run 1, then run the base prompt once more with only them replaced: the metric of that run.

Senders are Sites: a head (Site(l, "attn", head=h)), a whole attention sublayer (Site(l, "attn"): every head of the
layer) or an MLP's write (Site(l, "mlp")); a sender set is one of them or a list patched together. Labels work
where Sites do ("layers[9].attn.head[6]").

One row per (pair, sender set): `senders` (their labels joined by " + "), `receivers`, clean / corrupt / patched
metric and score (0 = the corrupt run, 1 = the clean run). Chunks of pairs run on the one driver
(resid.analyses.distributed.driver) as `execution=` says (resid.analyses.Execution): batch_size pairs per forward
pass with out-of-memory back-off, resumable with `out=`, on any executor, a progress bar on a terminal.
"""

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from resid.analyses.distributed.driver import drive
from resid.analyses.distributed.execution import Execution, as_execution
from resid.analyses.inputs import batch_size_for
from resid.analyses.metrics import metric_values
from resid.analyses.patching.pairs import Pairs, PairsJob, PatchDirection, PromptPairs, pairs_of, prepare, scored
from resid.capture import Capture
from resid.errors import ResidError
from resid.interventions import Replace
from resid.model import Inputs, Transformer
from resid.seq2seq import EncoderDecoder
from resid.sites import Site

RECEIVER_FIELDS = ("q", "k", "v", "pattern")
DIRECTION_CHANGED = (
    "patching.path was given no direction, so it patches direction='denoise' (the corrupt prompt is the base, the "
    "clean one the donor), the default of every patching method since resid 0.1.0. Before 0.1.0 path's default was "
    "'noise' (Wang et al.'s convention: the clean prompt the base, the corrupt one the donor), which answers the "
    "opposite question: pass direction='noise' for that, or direction='denoise' to keep this and silence this "
    "warning."
)


def path(
    model: Transformer | EncoderDecoder,
    pairs: Pairs | Inputs,
    corrupt: Inputs | None = None,
    targets: Sequence[str | int] | str | int | None = None,
    baselines: Sequence[str | int] | str | int | None = None,
    senders: Sequence[Site | str] | Sequence[Sequence[Site | str]] = (),
    receivers: str | Sequence[Site | str] = "logits",
    direction: PatchDirection | None = None,
    metric: str | Callable | None = None,
    execution: Execution | None = None,
) -> pd.DataFrame:
    """Path patching from each sender set to `receivers` on every pair of `pairs` (a patching.Pairs, without align;
    the old separate arguments still work for one release, as patching.activation's); execution: how it runs
    (resid.analyses.Execution). direction: "denoise" when not given, with a FutureWarning: path's default was
    "noise" (Wang et al.'s) before resid 0.1.0, and the two answer opposite questions."""
    given = pairs_of(pairs, "patching.path", corrupt=corrupt, targets=targets, baselines=baselines, metric=metric)
    if given.align is not None:
        raise ResidError("Path patching takes pairs of equal token lengths, patched position for position: drop "
                         "align= from its patching.Pairs.")
    if direction is None:
        warnings.warn(DIRECTION_CHANGED, FutureWarning, stacklevel=2)
        direction = "denoise"
    execution = as_execution(execution)
    if isinstance(model, EncoderDecoder):
        raise ResidError(f"Path patching does not take encoder-decoder models ({model.name}) yet: use "
                         "patching.activation or patching.atp with source=, whose sites span both stacks.")
    config = model.config
    sets = [_sender_set(group, config) for group in senders]
    if not sets:
        raise ResidError("path patching needs senders: a list of Sites (heads, Site(l, 'attn'), Site(l, 'mlp')), or "
                         "of lists of them.")
    if receivers != "logits":
        receivers = [_receiver(r, config) for r in ([receivers] if isinstance(receivers, (str, Site)) else receivers)]
    pairs, target_ids, baseline_ids, metric, label = prepare(model, given, direction)
    base = "clean" if direction == "noise" else "corrupt"
    size = batch_size_for(model, pairs.clean.tokens, execution.batch_size)
    job = PathJob.of(pairs, base, target_ids, baseline_ids, metric, size.value, dict(direction=direction, metric=label),
                     sets=sets, receivers=None if receivers == "logits" else receivers)
    df = drive(model, job, execution)
    names = [" + ".join(site.label for site in group) for group in sets]
    if df is None or df.empty:
        return pd.DataFrame(columns=["prompt_idx", "senders", "receivers", "patched_metric", "clean_metric",
                                     "corrupt_metric", "direction", "metric", "score"])
    order = {name: i for i, name in enumerate(names)}
    df = df.assign(_order=df["senders"].map(order)).sort_values(["_order", "prompt_idx"], kind="stable")
    return scored(df.drop(columns="_order").reset_index(drop=True), direction, label)


def _sender_set(group, config) -> list[Site]:
    group = [group] if isinstance(group, (Site, str)) else list(group)
    out = []
    for sender in group:
        site = Site.parse(sender) if isinstance(sender, str) else sender
        if not isinstance(site, Site):
            raise ResidError(f"A sender is a resid.Site (a head, Site(l, 'attn') or Site(l, 'mlp')), got {sender!r}.")
        ok = (site.part == "attn" and site.what in ("out", "z") and site.unit is not None) or (
            site.part in ("attn", "mlp") and site.what == "out")
        if not ok or site.positions is not None:
            raise ResidError(f"A sender is a head, a whole attention sublayer or an MLP write at every position, got "
                             f"{site.label}.")
        out.append(site.resolve(config))
    if not out:
        raise ResidError("A sender set is empty: give at least one Site.")
    return out


def _receiver(receiver, config) -> Site:
    site = Site.parse(receiver) if isinstance(receiver, str) else receiver
    if not isinstance(site, Site) or site.part != "attn" or site.what not in RECEIVER_FIELDS or site.unit is None:
        raise ResidError(f"A receiver is a head's input: Site(l, 'attn', head=h, field='q' | 'pattern') or "
                         f"Site(l, 'attn', kv_head=h, field='k' | 'v'), got {receiver!r}.")
    return site.resolve(config)


@dataclass
class PathJob(PairsJob):
    """The path-patching rows of chunks of pairs."""

    sets: list[list[Site]] = field(default_factory=list)
    receivers: list[Site] | None = None  # None: the logits

    name = "path patching"
    key = ("prompt_idx", "senders")

    def signature(self) -> dict:
        return {"analysis": "patching.path", "senders": [[s.label for s in g] for g in self.sets],
                "receivers": None if self.receivers is None else [s.label for s in self.receivers],
                **super().signature()}

    def rows(self, model: Transformer, pairs: PromptPairs, rows: list[int]) -> pd.DataFrame:
        """The rows of these pairs for every sender set: two runs, then one (or two, with receivers) per set, every
        metric kept on the device until the last set and moved to the host at once."""
        config, donor = model.config, "corrupt" if self.base == "clean" else "clean"
        base_tokens, donor_tokens = pairs.batch(self.base, rows), pairs.batch(donor, rows)
        z_capture = Capture(attn={"z"}, mlp={"out"}, embed=False, final_norm_scale=False)
        base_run = model.run(base_tokens, capture=z_capture, logits_at="last")
        donor_run = model.run(donor_tokens, capture=z_capture, logits_at="last")
        base_z, donor_layers = [r.attn.z for r in base_run.stream.layers], donor_run.stream.layers
        donor_z = [r.attn.z for r in donor_layers]
        t = torch.tensor([self.targets[i] for i in rows], device=model.device)
        b = None if self.baselines is None else torch.tensor([self.baselines[i] for i in rows], device=model.device)
        metrics = {side: metric_values(self.metric, run.logits[:, 0], t, b)
                   for side, run in ((self.base, base_run), (donor, donor_run))}
        wanted = {site.what for site in self.receivers or ()}
        patched_metrics = []
        for group in self.sets:
            # each layer's z whole: the senders' heads from the donor run, every other head frozen at the base run's
            from_donor = torch.zeros(config.n_layers, config.n_heads, dtype=torch.bool)
            for s in group:
                if s.part == "attn":
                    from_donor[s.layer, s.head if s.head is not None else slice(None)] = True
            from_donor = from_donor.to(model.device)
            patched = [Replace(Site(l, "attn", field="z"),
                               torch.where(from_donor[l, :, None], donor_z[l], base_z[l]))
                       for l in range(config.n_layers)]
            patched += [Replace(s, donor_layers[s.layer].mlp.out) for s in group if s.part == "mlp"]
            capture = Capture(attn=wanted, mlp=frozenset(), embed=False, final_norm_scale=False)
            run = model.run(base_tokens, capture=capture, interventions=patched, logits_at="last")
            logits = run.logits
            if self.receivers is not None:
                inputs = [Replace(site, run.stream.read(site)) for site in self.receivers]
                logits = model.run(base_tokens, capture=Capture.none(), interventions=inputs, logits_at="last").logits
            patched_metrics.append(metric_values(self.metric, logits[:, 0], t, b))
        on_host = torch.stack([metrics["clean"], metrics["corrupt"], *patched_metrics]).double().cpu().numpy()
        n = len(self.sets)
        return pd.DataFrame({
            "prompt_idx": np.tile(np.asarray(rows, dtype=np.int64), n),
            "senders": np.repeat([" + ".join(site.label for site in group) for group in self.sets], len(rows)),
            "receivers": "logits" if self.receivers is None else ", ".join(s.label for s in self.receivers),
            "patched_metric": on_host[2:].reshape(-1),
            "clean_metric": np.tile(on_host[0], n),
            "corrupt_metric": np.tile(on_host[1], n),
        })
