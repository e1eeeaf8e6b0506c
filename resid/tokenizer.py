"""Tokenizer: a thin wrapper over `tokenizers` with an explicit BOS policy and padding that cannot go wrong.

`to_tokens` returns the token ids with their attention mask and position ids. Position ids count real
tokens only, so a prompt gives the same logits at its real positions alone, left-padded or right-padded.
The wrapped tokenizer never adds special tokens itself; BOS is prepended here iff `prepend_bos`.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import tokenizers
import torch
from jaxtyping import Bool, Int
from torch import Tensor

from resid.errors import ResidError


@dataclass(frozen=True)
class Tokens:
    ids: Int[Tensor, "batch pos"]
    attention_mask: Bool[Tensor, "batch pos"]  # False at padding
    position_ids: Int[Tensor, "batch pos"]  # 0 at each prompt's first real token

    @classmethod
    def from_ids(cls, ids: Int[Tensor, "batch pos"]) -> "Tokens":
        """Unpadded ids: every token is real."""
        positions = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape)
        return cls(ids, torch.ones_like(ids, dtype=torch.bool), positions)

    def to(self, device: torch.device | str) -> "Tokens":
        return Tokens(self.ids.to(device), self.attention_mask.to(device), self.position_ids.to(device))

    def rows(self, index: Int[Tensor, "rows"]) -> "Tokens":
        """These prompts (by batch index, repeats allowed), keeping the padding they were tokenized with."""
        index = index.to(self.ids.device)
        return Tokens(self.ids[index], self.attention_mask[index], self.position_ids[index])

    @property
    def lengths(self) -> Int[Tensor, "batch"]:
        """Number of real (non-padding) tokens of each prompt."""
        return self.attention_mask.sum(dim=1)

    def last_positions(self) -> Int[Tensor, "batch"]:
        """Index of each prompt's last real token (whatever the padding side)."""
        n = self.ids.shape[1]
        index = torch.arange(n, device=self.ids.device).expand(self.ids.shape)
        return torch.where(self.attention_mask, index, -1).max(dim=1).values


class Tokenizer:
    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        bos_token_id: int | None,
        prepend_bos: bool,
        pad_token_id: int | None = None,
        eos_token_id: int | None = None,
    ):
        if prepend_bos and bos_token_id is None:
            raise ResidError("The tokenizer is set to prepend BOS but has no BOS token id; set prepend_bos=False.")
        self.tokenizer = tokenizer
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.prepend_bos = prepend_bos
        # Padding positions are masked out, so any id works; prefer the model's own pad/eos/bos.
        self.pad_token_id = next((i for i in (pad_token_id, eos_token_id, bos_token_id) if i is not None), 0)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, prepend_bos: bool | None = None) -> list[int]:
        if not isinstance(text, str):
            raise ResidError(f"Expected a string to tokenize, got {type(text).__name__}.")
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        bos = self.prepend_bos if prepend_bos is None else prepend_bos
        if bos:
            if self.bos_token_id is None:
                raise ResidError("prepend_bos=True, but this tokenizer has no BOS token.")
            ids = [self.bos_token_id, *ids]
        return ids

    def to_tokens(
        self,
        texts: str | Sequence[str],
        padding_side: Literal["left", "right"] = "left",
        prepend_bos: bool | None = None,
    ) -> Tokens:
        if padding_side not in ("left", "right"):
            raise ResidError(f"padding_side must be 'left' or 'right', got {padding_side!r}.")
        if isinstance(texts, str):
            texts = [texts]
        if len(texts) == 0:
            raise ResidError("No prompts given: pass a string or a non-empty list of strings.")
        encoded = [self.encode(t, prepend_bos) for t in texts]
        empty = [i for i, ids in enumerate(encoded) if not ids]
        if empty:
            raise ResidError(f"Prompt(s) {empty} tokenize to nothing: give non-empty text (or prepend_bos=True).")
        width = max(len(ids) for ids in encoded)
        ids = torch.full((len(encoded), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(encoded), width), dtype=torch.bool)
        for row, seq in enumerate(encoded):
            span = slice(width - len(seq), width) if padding_side == "left" else slice(0, len(seq))
            ids[row, span] = torch.tensor(seq, dtype=torch.long)
            mask[row, span] = True
        position_ids = (mask.long().cumsum(dim=1) - 1).clamp(min=0)
        return Tokens(ids, mask, position_ids)

    def to_str_tokens(self, text_or_ids: str | Sequence[int] | Tensor, prepend_bos: bool | None = None) -> list[str]:
        """One string per token, e.g. ['The', ' E', 'iff', 'el'] (byte-level pieces decoded one by one)."""
        if isinstance(text_or_ids, str):
            ids = self.encode(text_or_ids, prepend_bos)
        else:
            ids = [int(i) for i in (text_or_ids.flatten().tolist() if isinstance(text_or_ids, Tensor) else text_or_ids)]
        return [self.tokenizer.decode([i], skip_special_tokens=False) for i in ids]

    def decode(self, ids: int | Sequence[int] | Tensor) -> str:
        if isinstance(ids, int):
            ids = [ids]
        elif isinstance(ids, Tensor):
            ids = ids.flatten().tolist()
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_id(self, token: str) -> int | None:
        """The id of an exact vocabulary entry (as the tokenizer spells it), or None."""
        return self.tokenizer.token_to_id(token)
