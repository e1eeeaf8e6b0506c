"""A corpus cut into token windows, and the padded batches a forward pass runs: what every corpus scan (neuron and
feature top-activating examples), dictionary training and dictionary evaluation read.

Glossary: a *document* is one string of the corpus (resid.analyses.io.corpus); a *window* is at most `window`
tokens of one document, BOS first if the model prepends one (a long document becomes consecutive windows; each
window is a separate forward pass, so nothing in one attends to the previous window); windows come longest first
(ties in corpus order), so that padded batches of consecutive windows waste little. A batch is right-padded; its
*valid* positions are the real tokens that are not an added BOS (a BOS token's activations are attention-sink
outliers, never an example or a training token).

`cut_windows` is the windowing of scans and dictionaries: one document per window, BOS first. Lens training packs
instead (resid.analyses.lenses.data.pack: every document after a separator in one stream, cut into full windows of
seq_len tokens, as tuned-lens does), so its windows cross documents and need no padding; the two are named apart.
"""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Bool
from torch import Tensor

from resid.errors import ResidError
from resid.model import Transformer
from resid.tokenizer import Tokens


@dataclass(frozen=True)
class Window:
    doc: int  # index of the document in the corpus
    start: int  # index in the document's tokens (BOS excluded) of the window's first real token
    ids: np.ndarray  # token ids fed to the model (BOS first if the model prepends one)
    bos: bool  # whether ids[0] is a BOS added here

    def __len__(self) -> int:
        return len(self.ids)


def cut_windows(model: Transformer, texts: Sequence[str], window: int = 256) -> list[Window]:
    """Every document's tokens cut into windows of at most `window` tokens (BOS included), longest first."""
    tokenizer = model.require_tokenizer()
    limit = min(window, model.config.n_ctx) if isinstance(window, int) and not isinstance(window, bool) else 0
    bos = tokenizer.prepend_bos
    if limit < 1 + bos:
        raise ResidError(f"window must be an integer of at least {1 + bos} tokens, got {window!r}.")
    encoded = tokenizer.tokenizer.encode_batch(list(texts), add_special_tokens=False)
    step = limit - bos
    pieces = []
    for doc, encoding in enumerate(encoded):
        ids = np.asarray(encoding.ids, dtype=np.int64)
        for start in range(0, len(ids), step):
            body = ids[start : start + step]
            full = np.concatenate([[tokenizer.bos_token_id], body]) if bos else body
            pieces.append(Window(doc, start, full, bos))
    if not pieces:
        raise ResidError("The corpus tokenizes to no tokens at all: give documents with some text.")
    order = sorted(range(len(pieces)), key=lambda i: -len(pieces[i].ids))  # stable: ties keep corpus order
    return [pieces[i] for i in order]


def batch_tokens(
    chunk: Sequence[Window], pad_token_id: int, device: torch.device
) -> tuple[Tokens, Bool[Tensor, "batch pos"]]:
    """Right-padded Tokens for a chunk of windows, and the mask of positions that may be triggers
    (real tokens that are not an added BOS) [batch pos]."""
    tokens = Tokens.pad([w.ids.tolist() for w in chunk], pad_token_id, "right").to(device)
    valid = tokens.attention_mask.clone()
    valid[:, 0] &= torch.tensor([not w.bos for w in chunk], device=device)
    return tokens, valid


def iter_batches(model: Transformer, texts: Sequence[str], window: int, rows: int) -> Iterator[Tokens]:
    """The padded batches of `rows` windows a scan runs (for benchmarks that time a plain forward on the same ones)."""
    pieces = cut_windows(model, texts, window)
    for start in range(0, len(pieces), rows):
        yield batch_tokens(pieces[start : start + rows], model.require_tokenizer().pad_token_id, model.device)[0]
