"""What a Transformer takes and gives: its inputs (texts, Tokens or ids, as Tokens), a run's result, and the
encoded source a decoder's cross-attention reads."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor

from resid.capture import Capture
from resid.errors import ResidError
from resid.sites import Site
from resid.stream import ResidualStream
from resid.tokenizer import Tokenizer, Tokens

# Token ids are an integer Tensor [batch pos] or [pos]; kept as plain Tensor here so that a wrong shape or
# dtype reaches as_tokens' own check, which says what to pass, rather than a type checker's traceback.
Inputs = str | Sequence[str] | Tokens | Tensor
# Capture or None; typed loosely like Inputs so that a wrong value (True, a hook name) reaches run's own check.
CaptureArg = Capture | None | object


@dataclass(frozen=True)
class Memory:
    """An encoded source for a decoder's cross-attention: the encoder's final hidden state and which of its
    positions are real."""

    hidden: Float[Tensor, "batch src_pos d_model"]
    mask: Tensor  # [batch src_pos] bool, False at padding


@dataclass(frozen=True)
class Run:
    # `logits` (the property below): [batch pos d_vocab]; with run(logits_at=...) only those positions: [batch k
    # d_vocab]. An embedding model (config.head "none") and a run cut short (stop_at_layer) have none: reading
    # them is an error saying what to read instead (`no_logits`), never a silent None; `has_logits` asks.
    _logits: Float[Tensor, "batch n d_vocab"] | None
    stream: ResidualStream
    tokens: Tokens
    # Models with a final soft cap (Gemma 2): the logits before it, which are linear in the final residual
    # (what attribution decomposes); None for other models, whose logits are that already.
    uncapped_logits: Float[Tensor, "batch n d_vocab"] | None = None
    # The final hidden state at the same positions: the final norm's output, what the head reads (transformers'
    # last_hidden_state; an embedding model's output, e.g. mean-pooled into a sentence embedding)
    hidden: Float[Tensor, "batch n d_model"] | None = None
    # run(dictionaries=[...]): what each dictionary computed (resid.dictionaries.attach.Encoded), by its name;
    # `run.dictionaries[site]` finds one by the Site (or label) it reads
    dictionaries: Mapping = field(default_factory=lambda: MappingProxyType({}))
    # why a run without logits has none, and what to read instead (the error reading `logits` raises)
    no_logits: str = "This run has no logits; read run.hidden (the final hidden state) or run.stream.final()."

    def __repr__(self) -> str:  # shapes, not values (the dataclass's repr printed every tensor of the stream)
        logits = list(self._logits.shape) if self._logits is not None else None
        names = f", dictionaries {list(self.dictionaries)}" if self.dictionaries else ""
        return (f"Run(logits {logits}, tokens {list(self.tokens.ids.shape)}{names}, "
                f"stream={self.stream!r})")

    @property
    def logits(self) -> Float[Tensor, "batch n d_vocab"]:
        """The logits; an error naming what to read instead where the run has none (see `has_logits`)."""
        if self._logits is None:
            raise ResidError(self.no_logits)
        return self._logits

    @property
    def has_logits(self) -> bool:
        """Whether the run computed logits (not an embedding model's run, nor one cut short by stop_at_layer)."""
        return self._logits is not None

    def read(self, site: Site) -> Tensor:
        """The tensor at `site` (resid.sites): the stream's (ResidualStream.read), or a learned dictionary's (a
        feature's activation [batch pos], its error term, ...: run.dictionaries), at the site's prompt-relative
        positions if it names some ([batch k ...], in the order given)."""
        if site.of_dictionary:
            value = self._dictionary_read(site)
        elif site.part == "logits":
            value = self._logits_read(site)
        else:
            value = self.stream.read(site)
        if site.positions is None:
            return value
        if self.stream.captured is not None:
            raise ResidError(f"{site.label}: this run kept only some positions (Capture(positions=...)); read the site "
                             "without positions, or run with every position captured.")
        index = self.tokens.padded_index(site.positions)
        index = index.view(*index.shape, *([1] * (value.ndim - 2))).expand(-1, -1, *value.shape[2:])
        return value.gather(1, index.to(value.device))


    def _logits_read(self, site: Site) -> Tensor:
        """The logits [batch pos d_vocab] (run.logits), or one token's [batch pos]."""
        if self._logits is None:
            raise ResidError(f"{site.label}: {self.no_logits}")
        logits = self._logits
        if logits.shape[1] != self.tokens.ids.shape[1] and site.positions is not None:
            raise ResidError(f"{site.label}: this run unembedded only some positions (logits_at=...); read the site "
                             "without positions, or run with logits at every position.")
        if site.token is not None and site.token >= logits.shape[-1]:
            raise ResidError(f"{site.label}: token {site.token} is out of range; the vocabulary has "
                             f"{logits.shape[-1]} tokens (0..{logits.shape[-1] - 1}). Give a token id of the model's "
                             "tokenizer (model.to_single_token(' word')).")
        return logits if site.token is None else logits[..., site.token]

    def _dictionary_read(self, site: Site) -> Tensor:
        """A dictionary's feature activation [batch pos], or its reconstruction / error / skip path / decoder bias
        [batch pos d_out], from run.dictionaries (the one named by the site's `dictionary`, or the one at its
        site)."""
        encoded = self.dictionaries[site.dictionary if site.dictionary is not None else site.reconstructed]
        if site.feature is not None:
            return encoded.feature(site.feature)
        return encoded.term(site.what)


class TokenInputs:
    """A model's text and token-id inputs, through its tokenizer (`self.tokenizer`, `self.config`, `self.name`,
    `self.device`)."""

    def require_tokenizer(self) -> Tokenizer:
        """The tokenizer, or an error saying how to run without one."""
        if self.tokenizer is None:
            raise ResidError(
                f"Model {self.name!r} has no tokenizer (no tokenizer.json was found next to its weights): "
                "pass token ids as a [batch pos] tensor, or add tokenizer.json to the model folder."
            )
        return self.tokenizer

    def to_tokens(
        self, texts: str | Sequence[str], padding_side: Literal["left", "right"] = "left",
        prepend_bos: bool | None = None,
    ) -> Tokens:
        return self.require_tokenizer().to_tokens(texts, padding_side, prepend_bos)

    def to_str_tokens(self, text_or_ids: str | Sequence[int] | Tensor, prepend_bos: bool | None = None) -> list[str]:
        return self.require_tokenizer().to_str_tokens(text_or_ids, prepend_bos)

    def to_single_token(self, text: str) -> int:
        """The id of `text`, which must encode to exactly one token (TransformerLens's name), e.g. " Mary"."""
        return self.require_tokenizer().token_id(text)

    def as_tokens(self, inputs: Inputs) -> Tokens:
        """Prompts (left-padded), ready-made Tokens, or a tensor of ids, as Tokens on the model's device."""
        if isinstance(inputs, Tokens):
            tokens = inputs
        elif isinstance(inputs, Tensor):
            if inputs.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool):
                raise ResidError(f"Token ids must be an integer tensor, got dtype {inputs.dtype}.")
            ids = inputs[None] if inputs.ndim == 1 else inputs
            if ids.ndim != 2 or ids.shape[1] == 0:
                raise ResidError(f"Token ids must have shape [batch pos] or [pos], got {tuple(inputs.shape)}.")
            tokens = Tokens.from_ids(ids.long())
        else:
            tokens = self.to_tokens(inputs)
        n_pos, vocab = tokens.ids.shape[1], self.config.d_vocab
        if n_pos > self.config.n_ctx:
            raise ResidError(
                f"The input has {n_pos} tokens but {self.name} has a context of {self.config.n_ctx}: "
                f"shorten the prompt (e.g. keep its last {self.config.n_ctx} tokens) or split it."
            )
        if tokens.ids.numel() and (tokens.ids.min() < 0 or tokens.ids.max() >= vocab):
            raise ResidError(f"Token ids must lie in 0..{vocab - 1} (the vocabulary size is {vocab}).")
        return tokens.to(self.device)


def check_memory(model, memory: Memory | None, tokens: Tokens) -> Memory | None:
    """The encoded source of a decoder with cross-attention, checked against its tokens; None for other models,
    which must not be given one."""
    if not model.config.cross_attention:
        if memory is not None:
            raise ResidError(f"{model.name} has no cross-attention: it takes no memory (encoded source).")
        return None
    if memory is None:
        raise ResidError(
            f"{model.name} is the decoder of an encoder-decoder model: its cross-attention needs the source. Run the "
            "whole model, model.run(source, target) on the resid.EncoderDecoder, or pass memory=encoded source."
        )
    if memory.hidden.shape[0] != tokens.ids.shape[0] or memory.hidden.shape[-1] != model.config.d_model:
        raise ResidError(
            f"The encoded source has shape {tuple(memory.hidden.shape)}, but the decoder needs one row per target "
            f"prompt ({tokens.ids.shape[0]}) of width d_model={model.config.d_model}."
        )
    return memory
