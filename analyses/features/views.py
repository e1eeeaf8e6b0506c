"""A dictionary feature's directions in vocabulary space, the way resid.analyses.neurons reads an MLP neuron's value.

Feature i writes a_i * W_dec[i]. As written into the residual stream its direction is

    W_dec[i]                                  residual SAEs, SAEs and transcoders on a sublayer's write
    linear_post(W_dec[i] reshaped to heads @ W_O)   SAEs on attention's z (heads flattened), through the
                                                   attention's post-norm gain in models that have one

and its *decoder logits* are what that direction alone adds to each token's logit, through the final norm's gain
(and centering) when through_final_norm (model.readout.unembedding), its input-dependent scale left out (positive,
the same for every token: the ranking does not change). A dictionary's input normalization rescales every feature
of a token alike and is left out too.

Feature i reads with W_enc[:, i]. Its *encoder direction* is that column as a direction on the residual stream the
dictionary's input comes from: W_enc[:, i] for a residual input; on the standardized residual (centre(x) * s, the
norm's scale s frozen) for an input after a norm, the gain folded in (g * W_enc[:, i], centred for LayerNorm), so
that pre_i = direction . standardized + W_enc[:, i] . b_norm + b_enc[i]. `encoder_top_tokens` reads it against the
token embeddings (which tokens' own embedding excites the feature most). Everything is computed in float32.
"""

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from resid.analyses.checks import check_k
from resid.analyses.vocab import decode_ids
from resid.dictionaries import Dictionary, check
from resid.errors import ResidError
from resid.model import Transformer
from resid.sites import RESID_PARTS

CHUNK_BYTES = 256 * 2**20
# direction: "top" | "bottom"; rank: 1 = the extreme; value: the logit the feature's direction adds to token_id
COLUMNS = ("dictionary", "feature", "direction", "rank", "token_id", "token", "value")


def decoder_directions(model: Transformer, dictionary: Dictionary,
                       features: Sequence[int] | None = None) -> Float[Tensor, "n d_model"]:
    """The features' decoder directions as written into the residual stream (see the module docstring)."""
    d = _checked(model, dictionary)
    w_dec = d.W_dec.detach().float()[_index(d, features)]
    point = d.point_out
    site = point.site
    if site.part in RESID_PARTS or (site.what == "out" and not point.before_post_norm):
        return w_dec
    if site.part == "attn" and site.what == "z" and point.heads_flat:
        block = model.blocks[site.layer]
        cfg = model.config
        written = torch.einsum("n h e, h e m -> n m", w_dec.view(-1, cfg.n_heads, cfg.v_width), block.attn.W_O.float())
        return written if block.ln_attn_post is None else block.ln_attn_post.linear(written)
    raise ResidError(f"Dictionary {d.name!r} reconstructs {site.label}, which is not a write into the residual stream "
                     "(its decoder directions are not directions of the stream); decoder views take dictionaries on "
                     "the residual, on a sublayer's write and on attention's z.")


def decoder_logits(model: Transformer, dictionary: Dictionary, features: Sequence[int] | None = None,
                   through_final_norm: bool = True) -> Float[Tensor, "n d_vocab"]:
    """What each feature's decoder direction alone adds to every token's logit [n d_vocab] (the final norm's
    scale left out)."""
    with torch.no_grad():
        return decoder_directions(model, dictionary, features) @ model.readout.unembedding(through_final_norm)


def decoder_top_tokens(model: Transformer, dictionary: Dictionary, features: int | Sequence[int] | None = None,
                       k: int = 20, through_final_norm: bool = True, chunk_bytes: int = CHUNK_BYTES) -> pd.DataFrame:
    """Each feature's k most promoted and k most suppressed tokens (its decoder logits), one row per (feature,
    direction, rank), the columns of COLUMNS. features: None for all, an index or a list. Streams over chunks of
    features so that the [chunk d_vocab] logits stay within `chunk_bytes`."""
    d = _checked(model, dictionary)
    chosen = _index(d, [features] if isinstance(features, int) else features).tolist()
    k = check_k(k, "k", model.config.d_vocab)
    unembed = model.readout.unembedding(through_final_norm)
    rows = max(1, chunk_bytes // (4 * model.config.d_vocab))
    values, ids = [], []
    with torch.no_grad():
        for start in range(0, len(chosen), rows):
            logits = decoder_directions(model, d, chosen[start:start + rows]) @ unembed
            top, bottom = logits.topk(k, dim=-1), logits.topk(k, dim=-1, largest=False)
            values.append(torch.stack([top.values, bottom.values], 1).cpu())
            ids.append(torch.stack([top.indices, bottom.indices], 1).cpu())
    return _frame(model, d.name, np.asarray(chosen), torch.cat(values).numpy(), torch.cat(ids).numpy())


def encoder_directions(model: Transformer, dictionary: Dictionary,
                       features: Sequence[int] | None = None) -> Float[Tensor, "n d_model"]:
    """The features' encoder directions on the residual stream (or its standardized form; see the module
    docstring)."""
    d = _checked(model, dictionary)
    w_enc = d.W_enc.detach().float().T[_index(d, features)]  # [n d_in]
    point = d.point_in
    site = point.site
    if site.part in RESID_PARTS:
        return w_enc
    if site.what == "normalized":
        block = model.blocks[site.layer]
        norm = block.ln_attn if site.part == "attn" else block.ln_mlp
        if point.standardized:  # read before the gain: the standardized input is centred already (LayerNorm)
            return norm.centred(w_enc)
        return norm.fold(w_enc)
    raise ResidError(f"Dictionary {d.name!r} reads {site.label}, which is not the residual stream or a norm of it; "
                     "encoder views take dictionaries reading the residual or a sublayer's normalized input.")


def encoder_top_tokens(model: Transformer, dictionary: Dictionary, features: int | Sequence[int] | None = None,
                       k: int = 20) -> pd.DataFrame:
    """Each feature's k tokens whose embedding (times the model's embedding scale) reads highest and lowest on
    its encoder direction; the columns of COLUMNS."""
    d = _checked(model, dictionary)
    chosen = _index(d, [features] if isinstance(features, int) else features).tolist()
    k = check_k(k, "k", model.config.d_vocab)
    with torch.no_grad():
        embeddings = model.embed(torch.arange(model.config.d_vocab, device=model.device)[None])[0].float()
        scores = encoder_directions(model, d, chosen) @ embeddings.T
        top, bottom = scores.topk(k, dim=-1), scores.topk(k, dim=-1, largest=False)
    values = torch.stack([top.values, bottom.values], 1).cpu().numpy()
    ids = torch.stack([top.indices, bottom.indices], 1).cpu().numpy()
    return _frame(model, d.name, np.asarray(chosen), values, ids)


def _checked(model: Transformer, dictionary: Dictionary) -> Dictionary:
    if not isinstance(dictionary, Dictionary):
        raise ResidError(f"Feature views take a resid.dictionaries.Dictionary, got {type(dictionary).__name__}.")
    return dictionary if dictionary.point_in is not None else check(dictionary, model)


def _index(d: Dictionary, features: Sequence[int] | None) -> Tensor:
    if features is None:
        return torch.arange(d.d_sae, device=d.W_dec.device)
    chosen = list(features)
    bad = [f for f in chosen if not isinstance(f, (int, np.integer)) or isinstance(f, bool) or not 0 <= f < d.d_sae]
    if bad or not chosen:
        raise ResidError(f"Features {bad or chosen} are not valid: dictionary {d.name!r} has {d.d_sae} features "
                         f"(0..{d.d_sae - 1}); pass None for all, an index or a non-empty list.")
    return torch.tensor([int(f) for f in chosen], device=d.W_dec.device)


def _frame(model: Transformer, name: str, features: np.ndarray, values: np.ndarray, ids: np.ndarray) -> pd.DataFrame:
    """Rows from [feature 2 k] arrays."""
    n, _, k = values.shape
    return pd.DataFrame({
        "dictionary": [name] * (n * 2 * k),
        "feature": np.repeat(features.astype(np.int64), 2 * k),
        "direction": pd.Categorical.from_codes(np.tile(np.repeat(np.array([0, 1], dtype=np.int8), k), n),
                                               categories=["top", "bottom"]),
        "rank": np.tile(np.arange(1, k + 1, dtype=np.int64), 2 * n),
        "token_id": ids.reshape(-1).astype(np.int64),
        "token": decode_ids(model, ids.reshape(-1)),
        "value": values.reshape(-1).astype(np.float64),
    })
