"""EncoderDecoder: the original Transformer's shape (Vaswani et al. 2017; Marian): an encoder stream and a
decoder stream, joined by the decoder's cross-attention.

    model = resid.load("path/to/marian-folder")            # an EncoderDecoder
    run = model.run(source_texts, target_prefixes)          # Seq2SeqRun
    run.logits                                              # the decoder's next-token logits [batch pos d_vocab]
    run.stream                                              # the decoder's ResidualStream (with layers[l].cross)
    run.encoder.stream                                      # the encoder's ResidualStream

Both halves are resid Transformers: the encoder is bidirectional and has no head (its output, the final hidden
state, is the `memory` every cross-attention reads), the decoder is causal with a cross-attention sublayer per
block (resid.components.block). Cross-attention heads are typed, capturable (Capture(cross={...})), editable
(Site(l, "cross", head=h)) and attributable like self-attention heads; the encoder's sites are Site(...,
stack="encoder") ("encoder.layers[l]..."), routed to the encoder by `run`. Source padding is masked in every
cross-attention, so a pair's numbers do not depend on its batch.
"""

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from resid.capture import Capture
from resid.errors import ResidError
from resid.generate import Generation, generate
from resid.interventions import Intervention
from resid.model import CaptureArg, Inputs, Memory, Run, Transformer
from resid.selection import LogitsAt
from resid.sites import Site
from resid.stream import ResidualStream
from resid.tokenizer import Tokenizer, Tokens


def _texts(target) -> bool:
    return isinstance(target, Sequence) and not isinstance(target, str) and len(target) > 0 and all(
        isinstance(t, str) for t in target)


@dataclass(frozen=True)
class Seq2SeqRun:
    logits: Tensor  # the decoder's [batch n d_vocab]
    stream: ResidualStream  # the decoder's
    tokens: Tokens  # the decoder's (target) tokens
    encoder: Run  # the encoder's run: its stream, its tokens (the source) and its final hidden state
    hidden: Tensor | None = None  # the decoder's final hidden state

    def read(self, site: Site) -> Tensor:
        """The tensor at `site` (Run.read): an encoder site (Site(..., stack="encoder")) from the encoder's run."""
        if site.stack == "encoder":
            return self.encoder.read(dataclasses.replace(site, stack=None))
        return Run(self.logits, self.stream, self.tokens, hidden=self.hidden).read(site)


class EncoderDecoder(nn.Module):
    def __init__(self, encoder: Transformer, decoder: Transformer, name: str = "custom", weight_files: tuple = (),
                 decoder_start_token_id: int | None = None):
        super().__init__()
        if not decoder.config.cross_attention or encoder.config.head != "none":
            raise ResidError("An EncoderDecoder needs an encoder without a head and a decoder with cross-attention.")
        self.encoder, self.decoder = encoder, decoder
        self.name, self.weight_files = name, weight_files
        # the token every target starts from (config.json's decoder_start_token_id: Marian's and T5's pad id)
        self.decoder_start_token_id = decoder_start_token_id
        self.encoder.name = self.decoder.name = name

    @property
    def config(self):
        """The decoder's config (what the analyses of the next-token prediction read)."""
        return self.decoder.config

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self.decoder.tokenizer

    @property
    def device(self) -> torch.device:
        return self.decoder.device

    def encode(
        self, source: Inputs, capture: CaptureArg = None, interventions: Sequence[Intervention] = (), grad: bool = False
    ) -> Run:
        """The encoder's run over the source (default: nothing captured)."""
        return self.encoder.run(source, capture=Capture.none() if capture is None else capture,
                                interventions=interventions, grad=grad)

    def resolve(self, site: Site) -> Site:
        """The site checked against the stack it names: the encoder's for encoder sites, else the decoder's."""
        return site.resolve_encoder(self.encoder.config) if site.stack == "encoder" else site.resolve(self.config)

    @staticmethod
    def memory(encoded: Run) -> Memory:
        """What the decoder's cross-attention reads from an encoder run."""
        return Memory(encoded.hidden, encoded.tokens.attention_mask)

    def run(
        self,
        source: Inputs,
        target: Inputs,
        capture: CaptureArg = None,
        interventions: Sequence[Intervention] = (),
        grad: bool = False,
        logits_at: LogitsAt = None,
        encoder_capture: CaptureArg = None,
        encoder_interventions: Sequence[Intervention] = (),
    ) -> Seq2SeqRun:
        """Encode `source` and run the decoder over `target` (the target prefix, one per source: texts are
        tokenized as the analyses' prompts are; generate's target_tokens puts the start token first). `capture`,
        `interventions` and `logits_at` act on the decoder as in Transformer.run, except that interventions on
        encoder sites (Site(..., stack="encoder")) go to the encoder; `encoder_capture` and `encoder_interventions`
        act on the encoder."""
        encoder_interventions = [*encoder_interventions, *(iv for iv in interventions if _on_encoder(iv))]
        interventions = [iv for iv in interventions if not _on_encoder(iv)]
        encoder_interventions = [dataclasses.replace(iv, site=dataclasses.replace(self.resolve(iv.site), stack=None))
                                 if _on_encoder(iv) else iv for iv in encoder_interventions]  # errors name its site
        encoded = self.encode(source, encoder_capture, encoder_interventions, grad)
        decoder_tokens = self.decoder.as_tokens(target)
        if decoder_tokens.ids.shape[0] != encoded.tokens.ids.shape[0]:
            raise ResidError(
                f"Got {encoded.tokens.ids.shape[0]} sources and {decoder_tokens.ids.shape[0]} targets: an "
                "encoder-decoder run pairs each target prefix with one source."
            )
        run = self.decoder.run(decoder_tokens, capture, interventions, grad, logits_at, memory=self.memory(encoded))
        return Seq2SeqRun(run.logits, run.stream, run.tokens, encoded, run.hidden)

    def target_tokens(self, target: Inputs | None, n: int) -> Tokens:
        """The decoder's input for `target`: Tokens or ids as given; texts as the decoder start token followed by
        their tokens (no end-of-sequence token), left-padded; None: the start token alone, for each of n sources."""
        if target is not None and not isinstance(target, str) and not _texts(target):
            return self.decoder.as_tokens(target)
        start = self.decoder_start_token_id
        if start is None:
            raise ResidError(f"{self.name} has no decoder_start_token_id (config.json gives it): pass the target "
                             "prefix as token ids that begin with the decoder's start token.")
        texts = [""] * n if target is None else [target] if isinstance(target, str) else list(target)
        tokenizer = self.decoder.require_tokenizer() if any(texts) else None
        rows = [[start, *(tokenizer.encode(text, prepend_bos=False) if text else [])] for text in texts]
        pad = self.decoder.tokenizer.pad_token_id if self.decoder.tokenizer is not None else None
        return Tokens.pad(rows, start if pad is None else pad, "left")

    def generate(
        self,
        source: Inputs,
        max_new_tokens: int,
        target: Inputs | None = None,
        interventions: Sequence[Intervention] = (),
        encoder_interventions: Sequence[Intervention] = (),
        **options,
    ) -> Generation:
        """Translate (continue the target of) each source by `max_new_tokens` tokens with a KV cache: the source
        is encoded once (with `encoder_interventions`); the decoder starts from its start token, or from `target`
        (texts: the start token and their tokens; Tokens or ids: as given, left-padded), caching its own keys and
        values and, once, the cross-attentions' keys and values of the source. `interventions` act on the decoder
        at every step as in Transformer.generate; options: do_sample, temperature, top_k, seed, stop_at_eos,
        return_logits (resid.generate)."""
        encoded = self.encode(source, interventions=encoder_interventions)
        tokens = self.target_tokens(target, encoded.tokens.ids.shape[0])
        return generate(self.decoder, tokens, max_new_tokens, interventions, memory=self.memory(encoded), **options)

    def forward(self, source: Inputs, target: Inputs) -> Tensor:
        """The decoder's logits [batch pos d_vocab], nothing recorded."""
        return self.run(source, target, capture=Capture.none()).logits


def _on_encoder(intervention: Intervention) -> bool:
    site = getattr(intervention, "site", None)
    return isinstance(site, Site) and site.stack == "encoder"
