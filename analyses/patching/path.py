"""Path patching (Wang et al. 2022, the IOI circuit): the effect of sender heads on the answer *through* chosen
receivers only, every other path held at the base run.

With a base prompt and a donor prompt of each pair (direction="noise", as Wang et al.: the clean prompt is
the base, the corrupt one the donor; "denoise" swaps them):

  1. run the base prompt with the senders' z (or a sender MLP's write) taken from the donor run and every other
     head's z frozen at the base run's (the other MLPs are recomputed);
  2. receivers "logits": that run's metric is the answer (the senders' direct path and their paths through MLPs);
     receivers (layer, head, "q" | "k" | "v" | "pattern"): record those inputs in run 1, then run the base prompt
     once more with only them replaced: the metric of that run.

One row per (pair, sender set), with clean / corrupt / patched metric and score (0 = the corrupt run, 1 = the
clean run).
"""

from collections.abc import Callable, Sequence

import pandas as pd
import torch

from resid.analyses.ablation.values import read_unit
from resid.analyses.metrics import metric_values
from resid.analyses.patching.pairs import Direction, prepare, scored
from resid.capture import Capture
from resid.errors import ResidError
from resid.interventions import Replace, Site
from resid.model import Transformer

Sender = tuple[int, int | str]  # (layer, head), or (layer, "attn" | "mlp") for a whole sublayer
Receiver = tuple[int, int, str]  # (layer, head, "q" | "k" | "v" | "pattern")


def path(
    model: Transformer,
    clean: Sequence[str],
    corrupt: Sequence[str],
    targets: Sequence[str | int] | str | int,
    baselines: Sequence[str | int] | str | int | None = None,
    senders: Sequence[Sender] | Sequence[Sequence[Sender]] = (),
    receivers: str | Sequence[Receiver] = "logits",
    direction: Direction = "noise",
    metric: str | Callable | None = None,
) -> pd.DataFrame:
    """Path patching from each sender set to `receivers`. A sender is a head, (layer, head), or a whole sublayer,
    (layer, "attn") (every head of the layer) or (layer, "mlp") (its write taken from the donor run); a set is one
    sender or a list of them patched together."""
    sets = [[tuple(s)] if isinstance(s[0], int) else [tuple(h) for h in s] for s in senders]
    if not sets:
        raise ResidError("path patching needs senders: a list of (layer, head), or of lists of them.")
    pairs, target_ids, baseline_ids, metric, label = prepare(model, clean, corrupt, targets, baselines, metric,
                                                              direction)
    n, config = len(pairs.clean), model.config
    for layer, unit in (sender for group in sets for sender in group):
        if isinstance(unit, int):
            Site(layer, "attn", head=unit).validate(config)
        elif unit in ("attn", "mlp"):
            Site(layer, unit).validate(config)
        else:
            raise ResidError(f"A sender is (layer, head) or (layer, 'attn' | 'mlp'), got ({layer}, {unit!r}).")
    if receivers != "logits":
        receivers = [tuple(r) for r in receivers]
        for layer, head, kind in receivers:
            Site(layer, "attn", head=head, input=kind).validate(config)
    base, donor = ("clean", "corrupt") if direction == "noise" else ("corrupt", "clean")
    rows = range(n)
    base_tokens, donor_tokens = pairs.batch(base, rows), pairs.batch(donor, rows)
    z_capture = Capture(attn={"z"}, mlp={"out"}, embed=False, final_norm_scale=False)
    base_run = model.run(base_tokens, capture=z_capture, logits_at="last")
    donor_run = model.run(donor_tokens, capture=z_capture, logits_at="last")
    base_z, donor_layers = [r.attn.z for r in base_run.stream.layers], donor_run.stream.layers
    donor_z = [r.attn.z for r in donor_layers]
    t = torch.tensor(target_ids, device=model.device)
    b = None if baseline_ids is None else torch.tensor(baseline_ids, device=model.device)
    # the unpatched metrics come from the same two runs
    unpatched = {side: metric_values(metric, run.logits[:, 0], t, b).double().cpu().numpy()
                 for side, run in ((base, base_run), (donor, donor_run))}
    wanted = {kind for _, _, kind in receivers} if receivers != "logits" else set()
    records = []
    for group in sets:
        from_donor = {(l, h) for l, unit in group for h in ([unit] if isinstance(unit, int) else
                                                             range(config.n_heads) if unit == "attn" else [])}
        patched = [Replace(Site(l, "attn", head=h), (donor_z if (l, h) in from_donor else base_z)[l][..., h, :])
                   for l in range(config.n_layers) for h in range(config.n_heads)]
        patched += [Replace(Site(l, "mlp"), donor_layers[l].mlp.out) for l, unit in group if unit == "mlp"]
        run = model.run(base_tokens, capture=Capture(attn=wanted, mlp=frozenset(), embed=False,
                                                     final_norm_scale=False), interventions=patched, logits_at="last")
        logits = run.logits
        if receivers != "logits":
            inputs = [Replace(Site(l, "attn", head=h, input=kind),
                              read_unit(run.stream, (l, "attn", h, None, None, kind))) for l, h, kind in receivers]
            logits = model.run(base_tokens, capture=Capture.none(), interventions=inputs, logits_at="last").logits
        values = metric_values(metric, logits[:, 0], t, b).double().cpu().numpy()
        name = " + ".join(f"layers[{l}].attn head {u}" if isinstance(u, int) else f"layers[{l}].{u}" for l, u in group)
        records += [(i, name, values[i]) for i in range(n)]
    df = pd.DataFrame(records, columns=["prompt_idx", "senders", "patched_metric"])
    df["receivers"] = "logits" if receivers == "logits" else ", ".join(f"L{l}H{h}.{k}" for l, h, k in receivers)
    df["clean_metric"] = unpatched["clean"][df["prompt_idx"].to_numpy()]
    df["corrupt_metric"] = unpatched["corrupt"][df["prompt_idx"].to_numpy()]
    return scored(df, direction, label)
