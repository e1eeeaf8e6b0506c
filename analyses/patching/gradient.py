"""Attribution patching (AtP; Nanda 2023, Syed et al. 2023): every site's patching effect estimated at once, from
one run of each prompt of a pair and one backward pass:

    effect(site) ~ (donor activation - base activation) . d metric / d activation     (at the base run)

summed over the site's positions; method="atp*" adds AtP*'s refinements (Kramár et al. 2024; see
resid.analyses.patching.effects): queries and keys through the exact new pattern, and GradDrop, one more backward pass
per layer (no more forward passes), whose estimate of each effect's size fills the `magnitude` column.

Sites match resid.analyses.patching.activation's labels, so `compare` can join an estimate with the exact effects:
"resid_pre" (layer x position; d/d resid_pre(l) is d/d of the write just before it, layers[l-1].mlp.out, or of
the embedding for layer 0: exact for models whose stream is a sum of writes, so post-LN models are refused),
"sublayer" (each attention / MLP write), "head" (each head's z), and each head's "q", "k", "v" (keys and values
per key/value head) and "pattern".
"""

from collections.abc import Callable, Sequence
from typing import Literal

import pandas as pd
import torch

from resid.analyses.checks import check_choice
from resid.analyses.inputs import batch_size_for
from resid.analyses.metrics import metric_values
from resid.analyses.patching.effects import Effects, captured, gates, nodes
from resid.analyses.patching.exact import COLUMNS
from resid.analyses.patching.pairs import Align, Direction, Mapping, Pairs, prepare, scored
from resid.batching import run_batched
from resid.capture import Capture
from resid.errors import ResidError
from resid.model import Transformer

SITES = ("resid_pre", "sublayer", "head")
ALL_SITES = (*SITES, "q", "k", "v", "pattern")
Method = Literal["atp", "atp*"]


def attribution(
    model: Transformer,
    clean: Sequence[str],
    corrupt: Sequence[str],
    targets: Sequence[str | int] | str | int,
    baselines: Sequence[str | int] | str | int | None = None,
    sites: Sequence[str] | str = SITES,
    direction: Direction = "denoise",
    metric: str | Callable | None = None,
    batch_size: int | str = "auto",
    method: Method = "atp",
    align: Align = None,
) -> pd.DataFrame:
    """AtP (or AtP*) estimates for every site of `sites`, one row per (pair, site) with the columns of
    resid.analyses.patching.COLUMNS plus `method` and `magnitude`; patched_metric is the base run's metric plus the
    estimated effect (AtP*: with the query / key fix), magnitude the estimated size of the effect (AtP: |effect|;
    AtP*: GradDrop's)."""
    sites = [sites] if isinstance(sites, str) else list(sites)
    for kind in sites:
        check_choice(kind, "sites", ALL_SITES)
    check_choice(method, "method", ("atp", "atp*"))
    if "resid_pre" in sites and model.config.post_ln:
        raise ResidError("AtP of resid_pre needs a stream that is a sum of writes; post-LN models norm it after each "
                         "write. Use sites=('sublayer', 'head'), or exact activation patching.")
    pairs, target_ids, baseline_ids, metric, label = prepare(model, clean, corrupt, targets, baselines, metric,
                                                              direction, align)
    if "pattern" in sites:
        pairs.require_same_positions("sites='pattern' (a pattern spans every key position)")
    n = len(pairs.clean)
    base, donor = ("corrupt", "clean") if direction == "denoise" else ("clean", "corrupt")
    size = batch_size_for(model, pairs.clean.tokens, batch_size)
    work = lambda chunk: _chunk(model, pairs, base, donor, chunk, target_ids, baseline_ids, metric, sites,  # noqa: E731
                                method)
    df = pd.concat([frame for _, frame in run_batched(list(range(n)), work, size)], ignore_index=True)
    df["method"] = method
    return scored(df, direction, label)[[*COLUMNS, "method", "magnitude"]].reset_index(drop=True)


def _chunk(model, pairs: Pairs, base, donor, chunk, targets, baselines, metric, sites, method) -> pd.DataFrame:
    star = method == "atp*"
    capture = Capture(attn={"out"} | captured(sites), mlp={"out"}, final_norm_scale=False)
    base_tokens, donor_tokens = pairs.batch(base, chunk), pairs.batch(donor, chunk)
    t = torch.tensor([targets[i] for i in chunk], device=model.device)
    b = None if baselines is None else torch.tensor([baselines[i] for i in chunk], device=model.device)
    with torch.no_grad():
        donor_run = model.run(donor_tokens, capture=capture, logits_at="last")
    open_, hooks = gates(model) if star else (None, [])
    run = model.run(base_tokens, capture=capture, interventions=hooks, logits_at="last", grad=True)
    value = metric_values(metric, run.logits[:, 0], t, b)
    donor_value = metric_values(metric, donor_run.logits[:, 0], t, b).double().cpu().numpy()
    at = pairs.mapping(base, chunk, base_tokens, donor_tokens)
    effects = Effects(model, run.stream, donor_run.stream, base_tokens, sites, fix_qk=star, at=at)
    wrt = nodes(run.stream, sites)

    def gradient() -> dict:
        return dict(zip(wrt, torch.autograd.grad(value.sum(), list(wrt.values()), retain_graph=star)))

    estimate = {key: e.detach() for key, e in effects(gradient()).items()}
    if star:
        n_layers = model.config.n_layers
        size = {key: torch.zeros_like(e) for key, e in estimate.items()}
        for layer in range(n_layers):
            open_.fill_(1)
            open_[layer] = 0
            for key, e in effects(gradient(), dropped=layer).items():
                size[key] += e.detach().abs()
        magnitude = {key: s / max(n_layers - 1, 1) for key, s in size.items()}
    else:
        magnitude = {key: e.abs() for key, e in estimate.items()}
    frame = _rows(chunk, at, value.detach().double().cpu().numpy(), estimate, magnitude)
    index = {prompt: row for row, prompt in enumerate(chunk)}
    rows = frame["prompt_idx"].map(index).to_numpy()
    base_metric, donor_metric = value.detach().double().cpu().numpy()[rows], donor_value[rows]
    frame["clean_metric"] = donor_metric if base == "corrupt" else base_metric
    frame["corrupt_metric"] = base_metric if base == "corrupt" else donor_metric
    return frame


def _rows(chunk, at: Mapping, value, estimate: dict, magnitude: dict) -> pd.DataFrame:
    """One row per (pair, site): (prompt_idx, site, layer, part, head, position, patched_metric, magnitude); the
    residual stream at each aligned position, named by its position in the clean prompt."""
    records = []
    rows, columns = at.rows.tolist(), at.base.tolist()
    for key, effect in estimate.items():
        effect, size = effect.double().cpu().numpy(), magnitude[key].double().cpu().numpy()
        if key[0] == "resid_pre":
            layer = key[1]
            records += [(chunk[row], f"resid_pre {layer} pos {p}", layer, "resid_pre", None, p,
                         value[row] + effect[row, col], size[row, col]) for row, col, p in zip(rows, columns, at.clean)]
            continue
        layer, part, head = key
        if part in ("attn", "mlp"):
            label, part = f"layers[{layer}].{part}", part
        else:
            label = f"layers[{layer}].attn head {head}" + ("" if part == "head" else f" {part}")
            part = "attn"
        records += [(chunk[row], label, layer, part, head, None, value[row] + effect[row], size[row])
                    for row in range(len(chunk))]
    frame = pd.DataFrame(records, columns=["prompt_idx", "site", "layer", "part", "head", "position",
                                           "patched_metric", "magnitude"])
    for name in ("layer", "head", "position"):
        frame[name] = frame[name].astype("Int64")
    frame["neuron"] = pd.array([None] * len(frame), dtype="Int64")
    return frame.sort_values("prompt_idx", kind="stable")
