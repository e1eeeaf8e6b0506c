"""Tokenizer: a thin wrapper over `tokenizers` with an explicit BOS policy and padding that cannot go wrong.

`to_tokens` returns the token ids with their attention mask and position ids. Position ids count real
tokens only, so a prompt gives the same logits at its real positions alone, left-padded or right-padded.
The wrapped tokenizer never adds special tokens itself; BOS is prepended here iff `prepend_bos`. Template
tokenizers (BERT's) instead wrap the text in their own special tokens, [CLS] text [SEP], under the same switch.
Padding and truncation set in a tokenizer.json are switched off: resid pads, and never cuts a prompt silently.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import tokenizers
import torch
from jaxtyping import Bool, Int
from torch import Tensor

from resid.errors import ResidError, python_only
from resid.strings import check_unicode


@dataclass(frozen=True)
class Tokens:
    """A padded batch of prompts. Positions come in two kinds: *padded* indices into the batch's `pos` axis,
    and *prompt-relative* positions (0 = a prompt's first real token, BOS included when prepended; negative
    counts back from its last token), the kind every public API takes. `padded_index` maps prompt-relative
    positions to padded indices and `relative` maps back; nothing else in resid or its analyses does."""

    ids: Int[Tensor, "batch pos"]
    attention_mask: Bool[Tensor, "batch pos"]  # False at padding
    position_ids: Int[Tensor, "batch pos"]  # 0 at each prompt's first real token

    @classmethod
    def from_ids(cls, ids: Int[Tensor, "batch pos"]) -> "Tokens":
        """Unpadded ids: every token is real."""
        positions = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape)
        return cls(ids, torch.ones_like(ids, dtype=torch.bool), positions)

    @classmethod
    def pad(
        cls, sequences: Sequence[Sequence[int]], pad_token_id: int, padding_side: Literal["left", "right"] = "left"
    ) -> "Tokens":
        """Token id sequences (each non-empty) as one padded batch; position ids count real tokens only, so a
        prompt's logits at its real positions do not depend on the padding."""
        if padding_side not in ("left", "right"):
            raise ResidError(f"padding_side must be 'left' or 'right', got {padding_side!r}.")
        width = max(len(seq) for seq in sequences)
        ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.bool)
        for row, seq in enumerate(sequences):
            span = slice(width - len(seq), width) if padding_side == "left" else slice(0, len(seq))
            ids[row, span] = torch.as_tensor(seq, dtype=torch.long)
            mask[row, span] = True
        return cls(ids, mask, (mask.long().cumsum(dim=1) - 1).clamp(min=0))

    def to(self, device: torch.device | str) -> "Tokens":
        return Tokens(self.ids.to(device), self.attention_mask.to(device), self.position_ids.to(device))

    def rows(self, index: Int[Tensor, "rows"] | Sequence[int]) -> "Tokens":
        """These prompts (by batch index, repeats allowed), keeping the padding they were tokenized with."""
        index = torch.as_tensor(index, device=self.ids.device).long()
        return Tokens(self.ids[index], self.attention_mask[index], self.position_ids[index])

    def trim(self) -> "Tokens":
        """Without the columns that are padding in every row (e.g. after `rows` picked short prompts)."""
        real = self.attention_mask.any(dim=0).nonzero()[:, 0]
        if len(real) == self.ids.shape[1]:
            return self
        span = slice(int(real[0]), int(real[-1]) + 1)
        return Tokens(self.ids[:, span], self.attention_mask[:, span], self.position_ids[:, span])

    @property
    def lengths(self) -> Int[Tensor, "batch"]:
        """Number of real (non-padding) tokens of each prompt."""
        return self.attention_mask.sum(dim=1)

    def last_positions(self) -> Int[Tensor, "batch"]:
        """Padded index of each prompt's last real token (whatever the padding side)."""
        n = self.ids.shape[1]
        index = torch.arange(n, device=self.ids.device).expand(self.ids.shape)
        return torch.where(self.attention_mask, index, -1).max(dim=1).values

    def first_positions(self) -> Int[Tensor, "batch"]:
        """Padded index of each prompt's first real token. Real tokens are contiguous whichever side is
        padded, so they start at last - length + 1."""
        return self.last_positions() - self.lengths + 1

    def padded_index(self, positions: Sequence[int] | Sequence[Sequence[int]]) -> Int[Tensor, "batch k"]:
        """Padded indices of prompt-relative positions: one list for every prompt, or one list per prompt
        (each of the same length k). A position outside a prompt is an error naming the prompt."""
        per_prompt = [list(p) for p in positions] if positions and not isinstance(positions[0], int) else None
        lengths = self.lengths.tolist()
        rows = []
        for i, n in enumerate(lengths):
            wanted = per_prompt[i] if per_prompt is not None else list(positions)
            bad = [p for p in wanted if not -n <= p < n]
            if bad:
                raise ResidError(
                    f"Position(s) {bad} are out of range for prompt {i}, which has {n} tokens: use 0..{n - 1}, "
                    f"or -{n}..-1 from its last token (see model.to_str_tokens(prompt))."
                )
            rows.append([p % n for p in wanted])
        first = self.first_positions()[:, None]
        return first + torch.tensor(rows, dtype=torch.long, device=self.ids.device).view(len(lengths), -1)


    def relative(self, index: Int[Tensor, "batch k"]) -> Int[Tensor, "batch k"]:
        """The prompt-relative positions (0 = first real token) of padded indices [batch k], one row per prompt."""
        return index - self.first_positions().to(index.device)[:, None]


class Tokenizer:
    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        bos_token_id: int | None,
        prepend_bos: bool,
        pad_token_id: int | None = None,
        eos_token_id: int | None = None,
        template: bool = False,
        mask_token_id: int | None = None,
    ):
        if prepend_bos and bos_token_id is None:
            raise ResidError(f"The tokenizer is set to prepend BOS but has no BOS token id"
                             f"{python_only('; set prepend_bos=False')}.")
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self.tokenizer = tokenizer
        self.template = template  # prepend_bos means "wrap in the template's special tokens"
        self.mask_token_id = mask_token_id  # masked-LM models: the [MASK] token
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
        check_unicode(text)
        bos = self.prepend_bos if prepend_bos is None else prepend_bos
        if self.template:
            return self.tokenizer.encode(text, add_special_tokens=bos).ids
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
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
        if isinstance(texts, str):
            texts = [texts]
        if len(texts) == 0:
            raise ResidError("No prompts given: pass a string or a non-empty list of strings.")
        encoded = [self.encode(t, prepend_bos) for t in texts]
        empty = [i for i, ids in enumerate(encoded) if not ids]
        if empty:
            raise ResidError(f"Prompt(s) {empty} tokenize to nothing: give non-empty text"
                             f"{python_only(' (or prepend_bos=True)')}.")
        return Tokens.pad(encoded, self.pad_token_id, padding_side)

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

    def token_id(self, text: str, role: str = "text") -> int:
        """The id of `text` when it encodes to exactly one token (no BOS), e.g. token_id(" Mary"); any other
        text is an error showing its pieces (`role` names it there: "target", "baseline", ...). The text is what
        a prompt would contain, not the vocabulary's spelling of it (byte-level BPE stores " Mary" as 'ĠMary')."""
        if not isinstance(text, str) or text == "":
            raise ResidError(f"The {role} must be a non-empty string, got {text!r}.")
        ids = self.encode(text, prepend_bos=False)
        if len(ids) == 1:
            return ids[0]
        pieces = self.to_str_tokens(ids)
        hints = ""
        spelled = self.tokenizer.token_to_id(text)
        if spelled is not None:  # the user copied a vocabulary entry ('ĠMary'): name the text that encodes to it
            hints += f" {text!r} is the vocabulary's spelling of token {spelled}, text {self.decode(spelled)!r}."
        spaced = self.spaced_id(text)
        if spaced is not None:  # only where the space helps: an emoji or a spaced phrase gains nothing from it
            hints += f" Or, with a leading space, {' ' + text!r} is one token (id {spaced})."
        raise ResidError(
            f"The {role} {text!r} is {len(ids)} tokens, {pieces} (ids {ids}), but it must be one token. Pass the "
            f"first token, {pieces[0]!r} (id {ids[0]}), or an explicit token id.{hints}"
        )

    def spaced_id(self, text: str) -> int | None:
        """The id of " " + text when text has no leading whitespace and the spaced form is one token."""
        if not text or text[0].isspace():
            return None
        ids = self.encode(" " + text, prepend_bos=False)
        return ids[0] if len(ids) == 1 else None
