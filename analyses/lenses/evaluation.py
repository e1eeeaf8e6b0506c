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
"""

from collections.abc import Sequence

import pandas as pd
import torch
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm

from resid.analyses.io import provenance
from resid.analyses.lenses import data
from resid.analyses.lenses.kl import final_distribution, statistics
from resid.analyses.lenses.lens import Lens, LogitLens
from resid.analyses.logit_lens import short_label, site_list
from resid.capture import Capture
from resid.errors import ResidError
from resid.model import Transformer

METRICS = ("ce", "kl", "entropy", "top1")
COLUMNS = ("lens", "layer", "site", "label", "tokens", *METRICS)
CHUNK_ELEMENTS = 2**24  # logits per readout call ([chunk d_vocab] float32: 64 MiB)


@torch.no_grad()
def evaluate(
    model: Transformer,
    texts: Sequence[str] | Int[Tensor, "window seq_len"],
    lenses: Sequence[Lens] = (),
    every: str = "layer",
    seq_len: int = 512,
    max_tokens: int | None = None,
    batch_size: int | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """The logit lens and each of `lenses` at every site of ResidualStream.running(every) on `texts` (documents,
    packed into windows of seq_len, at most max_tokens tokens) or on ready windows of token ids; the columns of
    COLUMNS."""
    readers = [LogitLens(model), *lenses]
    for reader in readers:
        reader.check(model, every)
    names = [reader.name for reader in readers]
    if len(set(names)) != len(names):
        raise ResidError(f"The lenses have names {names}: evaluate one lens of each kind at a time.")
    max_windows = None if max_tokens is None else max(1, max_tokens // seq_len)
    windows = texts if isinstance(texts, Tensor) else data.pack(model, texts, seq_len, max_windows)
    if max_windows is not None:
        windows = windows[:max_windows]
    sites = site_list(model, every)
    sums = torch.zeros(len(readers), len(sites), len(METRICS) + 2, dtype=torch.float64)  # metrics, tokens, labels
    batch_size = batch_size or max(1, 2048 // windows.shape[1])
    chunk = max(1, CHUNK_ELEMENTS // model.config.d_vocab)
    bar = tqdm(total=windows.numel(), unit="tok", unit_scale=True, desc="lens eval", disable=not progress)
    for first in range(0, len(windows), batch_size):
        ids = windows[first:first + batch_size].to(model.device)
        run = model.run(ids, capture=Capture(final_norm_scale=False))
        final = run.logits.flatten(0, 1)
        resids = [resid.flatten(0, 1) for _, resid in run.stream.running(every)]
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
                    logits = reader.logits(resids[s][piece], site)
                    stats = statistics(logits, p, neg_entropy, top, labels[piece], has_label[piece], overwrite=True)
                    for m, metric in enumerate(METRICS):
                        sums[r, s, m] += stats[metric].nansum().double().cpu()
                    sums[r, s, -2] += len(p)
                    sums[r, s, -1] += has_label[piece].sum().cpu()
        bar.update(ids.numel())
    bar.close()
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
                  "data": data.fingerprint(windows)}
    df.attrs["provenance"] = provenance.describe(model, "tuned_lens.evaluate", parameters)
    return df
