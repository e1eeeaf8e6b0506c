"""A corpus as data for training and evaluating a lens.

    training, held_out = split(texts, held_out=0.1)    paragraphs, split by a hash of their text
    windows = pack(model, training, seq_len=512)       [window seq_len] token ids, packed as tuned-lens packs them
    order = window_order(len(windows), seed=42)        the training order: one seeded permutation

Glossary: a *document* is one string (the demo corpus gives one per paragraph, resid.analyses.io.corpus); a
*window* is seq_len consecutive token ids of the packed corpus, one row of a batch.

Packing follows tuned-lens's `data.chunk_and_tokenize`: the documents, each tokenized without BOS, are joined with
the end-of-text token between them and one before the first, and cut into windows of seq_len tokens; the last,
shorter window is dropped, so there is no padding and every position is a real next-token prediction.

The split is by document and depends only on each document's text (its sha256), so a paragraph is held out (or
not) whatever else the corpus holds and in whatever order; the same text never lands on both sides.
"""

import hashlib
from collections.abc import Sequence

import torch
from jaxtyping import Int
from torch import Tensor

from resid.errors import ResidError
from resid.model import Transformer


def split(texts: Sequence[str], held_out: float = 0.1) -> tuple[list[str], list[str]]:
    """(training documents, held-out documents), each in the corpus's order; about `held_out` of them held out."""
    if not 0 < held_out < 1:
        raise ResidError(f"held_out must be a fraction between 0 and 1, got {held_out!r}.")
    training, held = [], []
    for text in texts:
        fraction = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") / 2**64
        (held if fraction < held_out else training).append(text)
    if not training or not held:
        raise ResidError(f"Splitting {len(texts)} documents with held_out={held_out} left one side empty: give "
                         "more documents.")
    return training, held


def separator(model: Transformer) -> int:
    """The token between documents: end-of-text (tuned-lens's choice), else BOS."""
    tokenizer = model.require_tokenizer()
    token = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.bos_token_id
    if token is None:
        raise ResidError(f"{model.name}'s tokenizer has neither an end-of-text nor a BOS token to separate documents "
                         "with: pack the corpus yourself and pass the windows as a [window seq_len] tensor of ids.")
    return token


def pack(model: Transformer, texts: Sequence[str], seq_len: int, max_windows: int | None = None
         ) -> Int[Tensor, "window seq_len"]:
    """The documents packed into windows of seq_len tokens (see the module docstring); at most max_windows
    (the documents after those are not tokenized)."""
    if seq_len < 2:
        raise ResidError(f"seq_len must be at least 2 tokens, got {seq_len}.")
    if max_windows is not None and max_windows < 1:
        raise ResidError(f"max_windows must be positive, got {max_windows}.")
    tokenizer, sep = model.require_tokenizer(), separator(model)
    stream: list[int] = []
    for text in texts:
        stream.append(sep)
        stream += tokenizer.encode(text, prepend_bos=False)
        if max_windows is not None and len(stream) >= max_windows * seq_len:
            break
    n = len(stream) // seq_len if max_windows is None else min(len(stream) // seq_len, max_windows)
    if n == 0:
        raise ResidError(f"The corpus holds {len(stream)} tokens, fewer than one window of seq_len={seq_len}: give "
                         "more text or a shorter seq_len.")
    return torch.tensor(stream[: n * seq_len], dtype=torch.long).view(n, seq_len)


def window_order(n_windows: int, seed: int) -> Int[Tensor, "window"]:
    """The windows' training order: a permutation fixed by the seed, so that a resumed run sees the same batches."""
    return torch.randperm(n_windows, generator=torch.Generator().manual_seed(seed))


def packed_fingerprint(windows: Int[Tensor, "window seq_len"]) -> str:
    """sha256 of the windows' ids: a checkpoint resumes only on the data it was trained on."""
    return hashlib.sha256(windows.cpu().contiguous().numpy().tobytes()).hexdigest()
