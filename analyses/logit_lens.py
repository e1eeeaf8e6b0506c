"""The logit lens (nostalgebraist, 2020): decode the partial residual stream at every layer as if it were the
final one, to see when the prediction forms.

Sites, in stream order (resid.stream's names):

    resid_pre  (layer 0)   the embeddings
    resid_mid  (layer l)   after layer l's attention (sites="sublayer" only; absent for parallel blocks)
    resid_post (layer l)   after layer l; resid_post of the last layer is the final residual

norm="recompute" applies the final norm to each partial residual, with its own scale (the usual logit lens);
norm="frozen" uses the scale the final norm had in the full forward pass, which keeps the lens linear in the
writes (the decomposition analyses.attribution sums). Both equal the model's output at the last site.
KL is KL(final || lens): the model's own distribution against the lens's, in nats, as tuned-lens reports it.
"""

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from analyses.io import provenance
from analyses.prompts import as_prompt_list, batch_size_for, first_positions, prompt_positions
from analyses.vocab import Token, decode_ids, token_ids
from resid.batching import run_batched
from resid.capture import Capture
from resid.errors import ResidError
from resid.model import Transformer
from resid.stream import ResidualStream
from resid.tokenizer import Tokens

SITES = ("layer", "sublayer")
NORMS = ("recompute", "frozen")


@torch.no_grad()
def run(
    model: Transformer,
    prompts: str | Sequence[str],
    target: Token | Sequence[Token] | None = None,
    positions: int | Sequence[int] | str = -1,
    sites: str = "sublayer",
    norm: str = "recompute",
    k: int = 5,
    batch_size: int | str = "auto",
) -> pd.DataFrame:
    """Logit lens at the given prompt-relative `positions` (an index, a list, or "all") of every prompt.

    One row per (prompt, position, site, rank): prompt_idx pos input layer site norm rank token_id token
    prob logit, then per (prompt, position, site) target target_id target_prob target_logit target_rank
    (1 = top) entropy kl_to_final. target=None follows the model's own top prediction at each position."""
    if sites not in SITES:
        raise ResidError(f"sites must be one of {SITES}, got {sites!r}.")
    if norm not in NORMS:
        raise ResidError(f"norm must be one of {NORMS}, got {norm!r}.")
    if not isinstance(k, int) or k < 1:
        raise ResidError(f"k must be a positive integer, got {k!r}.")
    texts = as_prompt_list(prompts)
    targets = None if target is None else token_ids(model, target, len(texts), "target")
    wanted = positions if isinstance(positions, str) else [positions] if isinstance(positions, int) else list(positions)
    if not isinstance(wanted, str) and not wanted:
        raise ResidError("positions is empty: give an index, a list of indices, or 'all'.")
    k = min(k, model.config.d_vocab)
    chunks = run_batched(
        list(range(len(texts))),
        lambda chunk: _lens(model, [texts[i] for i in chunk], list(chunk), targets, wanted, sites, norm, k),
        batch_size_for(model, texts, batch_size),
    )
    df = pd.concat([frame for _, frame in chunks], ignore_index=True)
    df.attrs["provenance"] = provenance.describe(
        model, "logit_lens.run", {"positions": positions, "sites": sites, "norm": norm, "k": k}, texts, target
    )
    return df


def site_label(layer: int, site: str) -> str:
    """A short name for a site: "embed" for the embeddings, else e.g. "L3 mid" or "L3 post"."""
    return "embed" if site == "resid_pre" else f"L{layer} {site.removeprefix('resid_')}"


def site_list(model: Transformer, sites: str) -> list[tuple[int, str]]:
    """(layer, site) pairs in stream order."""
    result = [(0, "resid_pre")]
    for layer in range(model.config.n_layers):
        if sites == "sublayer" and model.config.block != "parallel":
            result.append((layer, "resid_mid"))
        result.append((layer, "resid_post"))
    return result


def _lens(
    model: Transformer,
    texts: list[str],
    prompt_idx: list[int],
    targets: list[int] | None,
    wanted: Sequence[int] | str,
    sites: str,
    norm: str,
    k: int,
) -> pd.DataFrame:
    tokens = model.to_tokens(texts)
    rel = prompt_positions(tokens.lengths.tolist(), wanted)
    first = first_positions(tokens)
    # Every (prompt, position) pair: batch row, prompt-relative position, padded position.
    rows = [b for b, ps in enumerate(rel) for _ in ps]
    rel_pos = [p for ps in rel for p in ps]
    padded = [first[b] + p for b, ps in enumerate(rel) for p in ps]
    kept = sorted(set(padded))
    run = model.run(tokens, capture=Capture(positions=kept), logits_at=torch.tensor(kept).expand(len(texts), -1))
    row_t = torch.tensor(rows, device=model.device)
    col_t = torch.tensor([kept.index(p) for p in padded], device=model.device)
    final_logits = run.logits[row_t, col_t].float()
    final_logp = torch.log_softmax(final_logits, dim=-1)
    if targets is None:
        target_t = final_logits.argmax(-1)
    else:
        target_t = torch.tensor([targets[prompt_idx[b]] for b in rows], device=model.device)
    scale = run.stream.final_norm_scale[row_t, col_t]
    stats = []
    for layer, site, resid in _partial_residuals(model, run.stream, sites):
        lens_logits = _decode(model, resid[row_t, col_t], scale, norm).float()
        stats.append(_statistics(lens_logits, final_logp, target_t, k))
    return _frame(model, tokens, rows, rel_pos, padded, prompt_idx, site_list(model, sites), stats, target_t, norm)


def _partial_residuals(model: Transformer, stream: ResidualStream, sites: str):
    """(layer, site, residual [batch kept d_model]) in stream order, summed incrementally."""
    resid = stream.embed if stream.pos_embed is None else stream.embed + stream.pos_embed
    yield 0, "resid_pre", resid
    for layer, record in enumerate(stream.layers):
        if sites == "sublayer" and not stream.parallel:
            resid = resid + record.attn.out
            yield layer, "resid_mid", resid
            resid = resid + record.mlp.out
        else:
            resid = resid + record.attn.out + record.mlp.out
        yield layer, "resid_post", resid


def _decode(
    model: Transformer, resid: Float[Tensor, "n d_model"], scale: Float[Tensor, "n 1"], norm: str
) -> Float[Tensor, "n d_vocab"]:
    ln = model.ln_final
    if norm == "recompute":
        normalized, _ = ln(resid[None])
        return model.unembed(normalized)[0]
    # The final norm with the full pass's scale, in the same float32 arithmetic as resid's Norm.
    x32 = resid.float()
    if ln.centre:
        x32 = x32 - x32.mean(-1, keepdim=True)
    normalized = x32 * scale.float() * (ln.w.float() + ln.gain_offset)
    if ln.b is not None:
        normalized = normalized + ln.b.float()
    return model.unembed(normalized.to(resid.dtype)[None])[0]


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
    tokens: Tokens,
    rows: list[int],
    rel_pos: list[int],
    padded: list[int],
    prompt_idx: list[int],
    sites: list[tuple[int, str]],
    stats: list[dict[str, Tensor]],
    target: Tensor,
    norm: str,
) -> pd.DataFrame:
    """Rows ordered by (pair, site, rank)."""
    n_pairs, n_sites, k = len(rows), len(sites), stats[0]["token_id"].shape[1]

    def stacked(name: str) -> np.ndarray:  # [pair site (k)]
        return torch.stack([s[name] for s in stats], dim=1).cpu().numpy()

    def per_rank(values: np.ndarray) -> np.ndarray:
        return np.repeat(values.reshape(-1), k)

    ids = stacked("token_id").reshape(-1)
    input_ids = np.array([tokens.ids[b, p].item() for b, p in zip(rows, padded)], dtype=np.int64)
    target_ids = target.cpu().numpy()
    per_pair = n_sites * k
    df = pd.DataFrame({
        "prompt_idx": np.repeat([prompt_idx[b] for b in rows], per_pair).astype("int64"),
        "pos": np.repeat(rel_pos, per_pair).astype("int64"),
        "input": np.repeat(decode_ids(model, input_ids), per_pair).astype(str),
        "layer": np.tile(np.repeat([layer for layer, _ in sites], k), n_pairs).astype("int64"),
        "site": np.tile(np.repeat([site for _, site in sites], k), n_pairs).astype(str),
        "norm": norm,
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
