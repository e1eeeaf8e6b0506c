"""A lens's per-site predictions at prompts (`resid.analyses.logit_lens` is this module): decode the partial
residual stream at every layer as if it were the final one, to see when the prediction forms (the logit lens,
nostalgebraist 2020), or through a tuned or Jacobian lens.

The sites are those of ResidualStream.running (resid.analyses.lenses.lens.site_list), summed once per call.
lens=None is the logit lens with the final norm recomputed; any resid.analyses.lenses.Lens is read as it is,
including how it treats the final norm (LogitLens(model, frozen_norm=True): the scale of the full forward pass,
which keeps the lens linear in the writes, the decomposition resid.analyses.attribution sums). KL is
KL(final || lens): the model's own distribution against the lens's, in nats, as tuned-lens reports it.
"""

from collections.abc import Sequence
from typing import Literal

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from resid.analyses.checks import check_choice, check_k, renamed
from resid.analyses.inputs import batch_size_for, check_sources, decoder_of
from resid.analyses.inputs import prompts as as_prompts
from resid.analyses.io import provenance
from resid.analyses.lenses.lens import Lens, LogitLens, short_label, site_list
from resid.analyses.vocab import Token, as_list, decode_ids, spacing_notes, token_ids
from resid.batching import run_batched
from resid.capture import Capture
from resid.errors import ResidError
from resid.model import Inputs, Memory, Transformer
from resid.seq2seq import EncoderDecoder
from resid.sites import Site
from resid.stream import EVERY, Every
from resid.tokenizer import Tokens

__all__ = ["COLUMNS", "run", "short_label", "site_list"]
# One row per (prompt, position, site, rank): the lens's top-k tokens (token_id token prob logit), then per
# (prompt, position, site) the target's prob, logit and rank (1 = top), the entropy and KL(final || lens).
COLUMNS = ("prompt_idx", "pos", "input", "layer", "site", "norm", "lens", "rank", "token_id", "token", "prob", "logit",
           "target", "target_id", "target_prob", "target_logit", "target_rank", "entropy", "kl_to_final")


def _norm_as_lens(model, lens: Lens | None, norm: str | None) -> Lens | None:
    """The lens an old call's `norm=` meant (deprecated: the final norm's treatment is the lens's), with a
    DeprecationWarning; `lens` as given when there is no `norm`."""
    if norm is None:
        return lens
    import warnings

    check_choice(norm, "norm", ("recompute", "frozen"))
    warnings.warn(f"logit_lens.run(norm={norm!r}) is deprecated and goes in the next release: the final norm's "
                  "treatment is the lens's, lens=LogitLens(model, frozen_norm=True) (any lens: "
                  ".with_frozen_norm(True)).", DeprecationWarning, stacklevel=3)
    frozen = norm == "frozen"
    if lens is not None:
        return lens.with_frozen_norm(frozen)
    return LogitLens(model.decoder if isinstance(model, EncoderDecoder) else model, frozen_norm=frozen)


@torch.no_grad()
def run(
    model: Transformer | EncoderDecoder,
    prompts: Inputs,
    targets: Token | Sequence[Token] | None = None,
    positions: int | Sequence[int] | Literal["all"] = -1,
    every: Every = "sublayer",
    k: int = 5,
    batch_size: int | str = "auto",
    source: Inputs | None = None,
    lens: Lens | None = None,
    *,
    target: Token | Sequence[Token] | None = None,
    norm: str | None = None,
) -> pd.DataFrame:
    """Logit lens at the given prompt-relative `positions` (an index, a list, or "all") of every prompt, read
    after every sublayer (every="sublayer") or every layer (every="layer").

    prompts: texts, resid.Tokens or token ids. One row per (prompt, position, site, rank), the columns of
    COLUMNS. targets: one token for all prompts or one per prompt; None follows the model's own top prediction at
    each position (`target`: the old name of `targets`, deprecated). `df.attrs["notes"]`: hints
    on the targets as given (resid.analyses.vocab.spacing_hint, read at each prompt's last position asked for).
    lens: None for the logit lens (final norm recomputed), or a lens of `model` (LogitLens(model, frozen_norm=True),
    resid.analyses.tuned_lens.read(model, folder), a JacobianLens); its name is the `lens` column, how it treats
    the final norm the `norm` column. norm: deprecated ("frozen": lens=LogitLens(model, frozen_norm=True))."""
    targets = renamed("targets", targets, "target", target)
    lens = _norm_as_lens(model, lens, norm)
    check_choice(every, "every", EVERY)
    if lens is not None and not isinstance(lens, Lens):
        raise ResidError(f"lens is a resid.analyses.lenses.Lens (LogitLens, TunedLens, JacobianLens) or None, not "
                         f"{type(lens).__name__}; the final norm's treatment is the lens's: "
                         "LogitLens(model, frozen_norm=True).")
    model, sources = decoder_of(model, source)  # encoder-decoder models: the decoder, reading `source`
    model.readout.unembed  # noqa: B018 -- raises for embedding models, which have no token logits to lens
    k = check_k(k, "k", model.config.d_vocab)
    reader = LogitLens(model) if lens is None else lens
    reader.check(model, every)  # a lens of another model, or without translators at these sites, fails here
    given = as_prompts(model, prompts)
    check_sources(sources, len(given))
    target_ids = None if targets is None else token_ids(model, targets, len(given), "target")
    if isinstance(positions, str):
        check_choice(positions, "positions", ("all",))
        wanted = None
    else:
        wanted = [positions] if isinstance(positions, int) else list(positions)
        if not wanted:
            raise ResidError("positions is empty: give an index, a list of indices, or 'all'.")
        given.tokens.padded_index(wanted)  # out-of-range positions fail before any forward pass
    as_given = as_list(targets, len(given))
    chunks = list(run_batched(
        list(range(len(given))),
        lambda chunk: _lens(model, given.batch(chunk), list(chunk), target_ids, as_given, wanted, every, k,
                            None if sources is None else sources.memory(chunk), reader),
        batch_size_for(model, given.tokens, batch_size),
    ))
    df = pd.concat([frame for _, (frame, _) in chunks], ignore_index=True)
    parameters = {"positions": positions, "every": every, "norm": reader.norm, "k": k, "lens": reader.name}
    df.attrs["provenance"] = provenance.describe(model, "logit_lens.run", parameters, given.record(), targets)
    df.attrs["notes"] = [note for _, (_, notes) in chunks for note in notes]
    return df


def _lens(
    model: Transformer,
    tokens: Tokens,
    prompt_idx: list[int],
    targets: list[int] | None,
    as_given: list[Token] | None,
    wanted: list[int] | None,
    every: str,
    k: int,
    memory: Memory | None,
    lens: Lens,
) -> tuple[pd.DataFrame, list[str]]:
    lengths = tokens.lengths.tolist()
    # Every (prompt, position) pair: batch row, prompt-relative position, and its column in the captured stream.
    if wanted is None:  # every position of every prompt: capture all, read each prompt's real ones
        rel = [list(range(n)) for n in lengths]
        columns = [tokens.rows([b]).padded_index(ps)[0].tolist() for b, ps in enumerate(rel)]
        capture, logits_at = Capture(), None
    else:
        rel = [[p % n for p in wanted] for n in lengths]
        columns = [list(range(len(wanted)))] * len(lengths)
        capture, logits_at = Capture(positions=wanted), wanted
    rows = [b for b, ps in enumerate(rel) for _ in ps]
    row_t = torch.tensor(rows, device=model.device)
    col_t = torch.tensor([c for cs in columns for c in cs], device=model.device)
    run = model.run(tokens, capture=capture, logits_at=logits_at, memory=memory)
    final_logits = run.logits[row_t, col_t].float()
    final_logp = torch.log_softmax(final_logits, dim=-1)
    if targets is None:
        target_t = final_logits.argmax(-1)
    else:
        target_t = torch.tensor([targets[prompt_idx[b]] for b in rows], device=model.device)
    scale = run.stream.final_norm_scale[row_t, col_t] if lens.frozen_norm else None
    stats = []
    for site, resid in run.stream.running(every):
        lens_logits = lens.logits(resid[row_t, col_t], site, scale).float()
        stats.append(_statistics(lens_logits, final_logp, target_t, k))
    rel_pos = [p for ps in rel for p in ps]
    padded = [c for cs in columns for c in cs] if wanted is None else tokens.padded_index(wanted).flatten().tolist()
    input_ids = tokens.ids[rows, padded].cpu().numpy()
    last_of_row = dict(zip(rows, range(len(rows))))  # batch row -> index of its last pair
    last_pair = [last_of_row[b] for b in range(len(prompt_idx))]
    notes = spacing_notes(model, as_given, final_logits[last_pair], prompt_idx)
    frame = _frame(model, input_ids, rows, rel_pos, prompt_idx, site_list(model, every), stats, target_t, lens.norm,
                   lens.name)
    return frame, notes


def _statistics(lens_logits: Tensor, final_logp: Tensor, target: Tensor, k: int) -> dict[str, Tensor]:
    logp = torch.log_softmax(lens_logits, dim=-1)
    top_logp, top_ids = logp.topk(k, dim=-1)
    n = torch.arange(len(target), device=target.device)
    target_logit = lens_logits[n, target]
    return {
        "token_id": top_ids,
        "prob": top_logp.exp(),
        "logit": lens_logits.gather(1, top_ids),
        "target_prob": logp[n, target].exp(),
        "target_logit": target_logit,
        "target_rank": (lens_logits > target_logit[:, None]).sum(-1) + 1,
        "entropy": -(logp.exp() * logp).sum(-1),
        "kl_to_final": (final_logp.exp() * (final_logp - logp)).sum(-1),
    }


def _frame(
    model: Transformer,
    input_ids: np.ndarray,
    rows: list[int],
    rel_pos: list[int],
    prompt_idx: list[int],
    sites: list[Site],
    stats: list[dict[str, Tensor]],
    target: Tensor,
    norm: str,
    lens: str,
) -> pd.DataFrame:
    """Rows ordered by (pair, site, rank), the columns of COLUMNS."""
    n_pairs, n_sites, k = len(rows), len(sites), stats[0]["token_id"].shape[1]

    def stacked(name: str) -> np.ndarray:  # [pair site (k)]
        return torch.stack([s[name] for s in stats], dim=1).cpu().numpy()

    def per_rank(values: np.ndarray) -> np.ndarray:
        return np.repeat(values.reshape(-1), k)

    ids = stacked("token_id").reshape(-1)
    target_ids = target.cpu().numpy()
    per_pair = n_sites * k
    df = pd.DataFrame({
        "prompt_idx": np.repeat([prompt_idx[b] for b in rows], per_pair).astype("int64"),
        "pos": np.repeat(rel_pos, per_pair).astype("int64"),
        "input": np.repeat(decode_ids(model, input_ids), per_pair).astype(str),
        "layer": np.tile(np.repeat([site.layer for site in sites], k), n_pairs).astype("int64"),
        "site": np.tile(np.repeat([site.label for site in sites], k), n_pairs).astype(str),
        "norm": norm,
        "lens": lens,
        "rank": np.tile(np.arange(1, k + 1), n_pairs * n_sites).astype("int64"),
        "token_id": ids.astype("int64"),
        "token": decode_ids(model, ids).astype(str),
        "prob": stacked("prob").reshape(-1).astype("float64"),
        "logit": stacked("logit").reshape(-1).astype("float64"),
        "target": np.repeat(decode_ids(model, target_ids), per_pair).astype(str),
        "target_id": np.repeat(target_ids, per_pair).astype("int64"),
    })
    for name in ("target_prob", "target_logit", "target_rank", "entropy", "kl_to_final"):
        values = per_rank(stacked(name))
        df[name] = values.astype("int64" if name == "target_rank" else "float64")
    return df
