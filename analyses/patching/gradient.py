"""Attribution patching (AtP; Nanda 2023, Syed et al. 2023): every site's patching effect estimated at once, from
one run of each prompt of a pair and one backward pass:

    effect(site) ~ (donor activation - base activation) . d metric / d activation     (at the base run)

summed over the site's positions. Sites match analyses.patching.activation's labels, so `compare` can join an
estimate with the exact effects: "resid_pre" (layer x position; d/d resid_pre(l) is d/d of the write just before
it, layers[l-1].mlp.out, or of the embedding for layer 0: exact for models whose stream is a sum of writes, so
post-LN models are refused), "sublayer" (each attention / MLP write) and "head" (each head's z).
"""

from collections.abc import Callable, Sequence

import pandas as pd
import torch

from analyses.checks import check_choice
from analyses.inputs import batch_size_for
from analyses.metrics import metric_values
from analyses.patching.exact import COLUMNS, Direction, Pairs, prepare, scored
from resid.batching import run_batched
from resid.capture import Capture
from resid.errors import ResidError
from resid.model import Transformer

SITES = ("resid_pre", "sublayer", "head")


def attribution(
    model: Transformer,
    clean: Sequence[str],
    corrupt: Sequence[str],
    targets: Sequence[str | int] | str | int,
    baselines: Sequence[str | int] | str | int | None = None,
    sites: Sequence[str] = SITES,
    direction: Direction = "denoise",
    metric: str | Callable | None = None,
    batch_size: int | str = "auto",
) -> pd.DataFrame:
    """AtP estimates for every site of `sites`, one row per (pair, site) with the columns of
    analyses.patching.COLUMNS; patched_metric is the base run's metric plus the estimated effect."""
    sites = [sites] if isinstance(sites, str) else list(sites)
    for kind in sites:
        check_choice(kind, "sites", SITES)
    if "resid_pre" in sites and model.config.post_ln:
        raise ResidError("AtP of resid_pre needs a stream that is a sum of writes; post-LN models norm it after each "
                         "write. Use sites=('sublayer', 'head'), or exact activation patching.")
    pairs, target_ids, baseline_ids, metric, label = prepare(model, clean, corrupt, targets, baselines, metric,
                                                              direction)
    n = len(pairs.clean)
    base, donor = ("corrupt", "clean") if direction == "denoise" else ("clean", "corrupt")
    size = batch_size_for(model, pairs.clean.tokens, batch_size)
    work = lambda chunk: _chunk(model, pairs, base, donor, chunk, target_ids, baseline_ids, metric, sites)  # noqa: E731
    df = pd.concat([frame for _, frame in run_batched(list(range(n)), work, size)], ignore_index=True)
    return scored(df, direction, label)[list(COLUMNS)].reset_index(drop=True)


def _chunk(model, pairs: Pairs, base, donor, chunk, targets, baselines, metric, sites) -> pd.DataFrame:
    heads = "head" in sites
    capture = Capture(attn={"z", "out"} if heads else {"out"}, mlp={"out"}, final_norm_scale=False)
    base_tokens, donor_tokens = pairs.batch(base, chunk), pairs.batch(donor, chunk)
    t = torch.tensor([targets[i] for i in chunk], device=model.device)
    b = None if baselines is None else torch.tensor([baselines[i] for i in chunk], device=model.device)
    with torch.no_grad():
        donor_run = model.run(donor_tokens, capture=capture, logits_at="last")
    donor_stream = donor_run.stream
    run = model.run(base_tokens, capture=capture, logits_at="last", grad=True)
    value = metric_values(metric, run.logits[:, 0], t, b)
    donor_value = metric_values(metric, donor_run.logits[:, 0], t, b).double().cpu().numpy()
    stream, layers = run.stream, run.stream.layers
    wrt = {("embed",): stream.embed}
    for l, record in enumerate(layers):
        wrt[(l, "attn")], wrt[(l, "mlp")] = record.attn.out, record.mlp.out
        if heads:
            wrt[(l, "z")] = record.attn.z
    grads = dict(zip(wrt, torch.autograd.grad(value.sum(), list(wrt.values()))))
    value = value.detach().double().cpu().numpy()
    mask = base_tokens.attention_mask.to(model.device)[..., None]  # padding positions carry no effect
    records = []

    def add(site, layer, part, head, position, effect):  # effect: [batch] over the chunk's rows
        for row, e in enumerate(effect.double().cpu().numpy()):
            records.append((chunk[row], site, layer, part, head, position, value[row] + e))

    donor_layers = donor_stream.layers
    for l in range(len(layers)):
        for part in ("attn", "mlp"):
            if "sublayer" in sites:
                delta = getattr(donor_layers[l], part).out - getattr(layers[l], part).out.detach()
                add(f"layers[{l}].{part}", l, part, None, None, (delta * grads[(l, part)] * mask).sum((1, 2)))
        if heads:
            delta = donor_layers[l].attn.z - layers[l].attn.z.detach()
            per_head = (delta * grads[(l, "z")] * mask[..., None]).sum((1, 3))  # [batch head]
            for h in range(per_head.shape[1]):
                add(f"layers[{l}].attn head {h}", l, "attn", h, None, per_head[:, h])
    if "resid_pre" in sites:
        first, lengths = base_tokens.first_positions().tolist(), base_tokens.lengths.tolist()
        base_resid = [r.detach() for _, _, r in stream.running("layer")]
        donor_resid = [r for _, _, r in donor_stream.running("layer")]
        for l in range(len(layers)):
            grad = grads[("embed",)] if l == 0 else grads[(l - 1, "mlp")]
            per_position = ((donor_resid[l] - base_resid[l]) * grad).sum(-1).double().cpu().numpy()  # [batch pos]
            for row in range(len(chunk)):
                effects = per_position[row, first[row] : first[row] + lengths[row]]
                records += [(chunk[row], f"resid_pre {l} pos {p}", l, "resid_pre", None, p, value[row] + e)
                            for p, e in enumerate(effects)]
    frame = pd.DataFrame(records, columns=["prompt_idx", "site", "layer", "part", "head", "position", "patched_metric"])
    index = {prompt: row for row, prompt in enumerate(chunk)}
    rows = frame["prompt_idx"].map(index).to_numpy()
    base_metric, donor_metric = value[rows], donor_value[rows]
    frame["clean_metric"] = donor_metric if base == "corrupt" else base_metric
    frame["corrupt_metric"] = base_metric if base == "corrupt" else donor_metric
    for name in ("layer", "head", "position"):
        frame[name] = frame[name].astype("Int64")
    frame["neuron"] = pd.array([None] * len(frame), dtype="Int64")
    return frame
