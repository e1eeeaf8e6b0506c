"""Sentence embeddings and the exact decomposition of their similarity.

`embeddings` pools an encoder's final hidden state as sentence-transformers does for mean-pooling models such as
all-MiniLM-L6-v2: the mean over each text's real tokens ([CLS] and [SEP] included), then (normalize=True, that
model's Normalize module) divided by its length.

`similarity(model, texts, others)` decomposes the cosine similarity (or dot product) of each text's embedding
with its partner's into the text's components, exactly: the partner's embedding is the direction, the text's
pooled hidden state is a sum of writes read out at every position (resid.readout, post-LN norms frozen), and
its length is frozen like a norm's scale. The rows sum to the similarity (column `similarity`).

    emb = similarity.embeddings(model, ["A man is eating food.", "A man is riding a horse."])
    df = similarity.similarity(model, ["A man is eating food."], ["A man is eating a meal."], level="head")
"""

from collections.abc import Sequence
from typing import Literal

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from resid.analyses.attribution import LEVELS, Level, capture_for, meta_columns
from resid.analyses.checks import check_choice
from resid.analyses.contributions import probe_frame, read_out
from resid.analyses.inputs import batch_size_for
from resid.analyses.inputs import prompts as as_prompts
from resid.analyses.io import provenance
from resid.batching import run_batched
from resid.capture import Capture
from resid.errors import ResidError
from resid.model import Inputs, Transformer

Metric = Literal["cosine", "dot"]


@torch.no_grad()
def embeddings(
    model: Transformer, texts: Inputs, normalize: bool = True, batch_size: int | str = "auto"
) -> Float[Tensor, "n d_model"]:
    """Mean-pooled final hidden states (float32), one row per text; divided by their length if `normalize`."""
    given = as_prompts(model, texts)

    def pooled(chunk: Sequence[int]) -> Tensor:
        tokens = given.batch(chunk)
        hidden = model.run(tokens, capture=Capture.none()).hidden.float()
        mask = tokens.attention_mask.float()[..., None]
        return (hidden * mask).sum(1) / mask.sum(1)

    size = batch_size_for(model, given.tokens, batch_size)
    rows = torch.cat([result for _, result in run_batched(list(range(len(given))), pooled, size)])
    return torch.nn.functional.normalize(rows, dim=-1) if normalize else rows


@torch.no_grad()
def similarity(
    model: Transformer,
    texts: Sequence[str],
    others: Sequence[str],
    level: Level = "head",
    metric: Metric = "cosine",
    batch_size: int | str = "auto",
) -> pd.DataFrame:
    """Direct attribution of sim(embedding(texts[i]), embedding(others[i])) to the components of texts[i], with
    others[i]'s embedding held fixed. One row per (pair, component), the columns of attribution.COLUMNS plus
    `other` (the partner text); `target` is the metric's name and `similarity` (in place of `logit`) the
    similarity, which each pair's values sum to exactly. Each chunk of pairs takes one forward pass, texts and
    partners together."""
    check_choice(metric, "metric", ("cosine", "dot"))
    check_choice(level, "level", LEVELS)
    if isinstance(texts, str) or isinstance(others, str):
        raise ResidError("similarity takes lists of texts and of their partners, e.g. (['a cat'], ['a kitten']).")
    if len(texts) != len(others) or not texts:
        raise ResidError(f"similarity needs one partner per text: got {len(texts)} texts and {len(others)} others.")
    n, cosine = len(texts), metric == "cosine"
    given = as_prompts(model, list(texts) + list(others))

    def pairs(chunk: Sequence[int]) -> pd.DataFrame:
        k = len(chunk)
        tokens = given.batch([*chunk, *(n + i for i in chunk)])  # the texts, then their partners
        run = model.run(tokens, capture=capture_for(model, level, None))
        mask = tokens.attention_mask
        weights = (mask / mask.sum(1, keepdim=True))[..., None]
        pooled = (run.hidden.float() * weights).sum(1)
        partners = torch.cat([pooled[k:], pooled[:k]])  # each row reads its partner's embedding
        partners = torch.nn.functional.normalize(partners, dim=-1) if cosine else partners
        direction, actual = read_out(model, run, partners, torch.zeros(2 * k, device=model.device), mask, cosine)
        meta = meta_columns(model, tokens, [*chunk, *chunk], tokens.last_positions()[:, None], [metric] * 2 * k,
                            [-1] * 2 * k, None, None)
        meta["pos"], meta["token"] = [-1] * 2 * k, ["<mean>"] * 2 * k
        df = probe_frame(model, run, direction, actual, meta, level)
        return df.iloc[: len(df) // 2]  # the texts' rows (the partners' decompose the same score the other way)

    size = batch_size_for(model, given.tokens, batch_size)
    df = pd.concat([part for _, part in run_batched(list(range(n)), pairs, size)], ignore_index=True)
    df = df.rename(columns={"readout": "similarity"})
    df["other"] = [others[i] for i in df["prompt_idx"]]
    df.attrs["provenance"] = provenance.describe(
        model, "similarity.similarity", {"level": level, "metric": metric, "others": list(others)}, list(texts), metric
    )
    df.attrs["notes"] = []
    return df
