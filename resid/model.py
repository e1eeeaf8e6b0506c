"""Transformer: embedding -> blocks -> final norm -> unembed, whose `run` records the residual stream.

    run = model.run(["The Eiffel Tower is in"], capture=resid.Capture.all(), interventions=[...])
    run.logits            # [batch pos d_vocab]
    run.stream            # ResidualStream: typed writes, resid_pre/mid/post, components()

No weight processing happens by default: the logits equal Hugging Face's for the same weights.
"""

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor, nn

from resid.capture import Capture
from resid.components.attention import AttnContext, allowed_keys
from resid.components.block import Block
from resid.components.embed import Embed, PosEmbed, TokenTypeEmbed, Unembed
from resid.components.head import MLMHead
from resid.components.norm import Norm
from resid.components.rotary import Rotary
from resid.config import ModelConfig
from resid.errors import ResidError
from resid.generate import Generation, generate
from resid.interventions import Intervention, plan
from resid.readout import Readout
from resid.selection import LogitsAt, logit_index, position_selector
from resid.records import AttnRecord, CrossRecord, LayerRecord, MLPRecord, absent_fields
from resid.stream import ResidualStream, StreamNorms
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
    # [batch pos d_vocab]; with run(logits_at=...) only those positions: [batch k d_vocab]. None for embedding
    # models (config.head "none"), whose output is `hidden`.
    logits: Float[Tensor, "batch n d_vocab"] | None
    stream: ResidualStream
    tokens: Tokens
    # Models with a final soft cap (Gemma 2): the logits before it, which are linear in the final residual
    # (what attribution decomposes); None for other models, whose logits are that already.
    uncapped_logits: Float[Tensor, "batch n d_vocab"] | None = None
    # The final hidden state at the same positions: the final norm's output, what the head reads (transformers'
    # last_hidden_state; an embedding model's output, e.g. mean-pooled into a sentence embedding)
    hidden: Float[Tensor, "batch n d_model"] | None = None


class Transformer(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        tokenizer: Tokenizer | None = None,
        name: str = "custom",
        weight_files: tuple[Path, ...] = (),
    ):
        super().__init__()
        self.config = config
        self.tokenizer = tokenizer
        self.name = name  # what resid.load was given, for provenance
        self.weight_files = weight_files  # files the weights were read from, for provenance
        self.embed = Embed(config)
        self.pos_embed = PosEmbed(config) if config.positions in ("learned", "sinusoidal") else None
        self.type_embed = TokenTypeEmbed(config) if config.n_token_types else None
        self.ln_embed = Norm(config) if config.embed_norm else None
        self.rotary = Rotary(config) if config.positions == "rotary" else None
        # Gemma 3's sliding layers rotate with their own (local, unscaled) base
        local = config.positions == "rotary" and config.rotary_base_local is not None
        self.rotary_local = Rotary(config, base=config.rotary_base_local, scaled=False) if local else None
        self.blocks = nn.ModuleList(Block(config, layer) for layer in range(config.n_layers))
        self.ln_final = Norm(config) if config.final_norm else None
        self.mlm_head = MLMHead(config) if config.head == "mlm" else None
        self.unembed = Unembed(config, self.embed) if config.head != "none" else None

    @property
    def device(self) -> torch.device:
        return self.embed.W_E.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.W_E.dtype

    @property
    def readout(self) -> Readout:
        """Final norm + head: logits of residual vectors and directions on the stream (resid.readout)."""
        return Readout(self.ln_final, self.unembed, self.mlm_head, self.name)

    def require_tokenizer(self) -> Tokenizer:
        """The tokenizer, or an error saying how to run without one."""
        if self.tokenizer is None:
            raise ResidError(
                f"Model {self.name!r} has no tokenizer (no tokenizer.json was found next to its weights): "
                "pass token ids as a [batch pos] tensor, or add tokenizer.json to the model folder."
            )
        return self.tokenizer

    def to_tokens(
        self, texts: str | Sequence[str], padding_side: Literal["left", "right"] = "left", prepend_bos: bool | None = None
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

    def forward(self, inputs: Inputs) -> Float[Tensor, "batch pos out"]:
        """Logits [batch pos d_vocab] of texts (left-padded), Tokens, or ids [batch pos] / [pos], recording
        nothing, without gradients and without interventions: `model(inputs)` as a plain nn.Module (an embedding
        model gives its final hidden state [batch pos d_model]). For the stream, interventions, gradients or
        logits at chosen positions use `run`."""
        run = self.run(inputs, capture=Capture.none())
        return run.hidden if run.logits is None else run.logits

    def run(
        self,
        inputs: Inputs,
        capture: CaptureArg = None,
        interventions: Sequence[Intervention] = (),
        grad: bool = False,
        logits_at: LogitsAt = None,
        memory: Memory | None = None,
    ) -> Run:
        """Forward pass recording what `capture` asks for (default: the residual writes), with
        `interventions` applied. Gradients are off unless grad=True.

        logits_at: None for logits at every position; "last" for each prompt's last real token; a list of
        prompt-relative positions; or a [batch] / [batch k] tensor of padded indices. run.logits is then
        [batch k d_vocab]: the unembedding (often the largest matmul) runs only where it is needed.

        memory: decoders of encoder-decoder models only, the encoded source their cross-attention reads (one row
        per prompt); resid.EncoderDecoder.run passes it."""
        capture = Capture() if capture is None else capture
        if not isinstance(capture, Capture):
            raise ResidError(
                f"capture must be a resid.Capture, got {capture!r}: e.g. resid.Capture.all(), resid.Capture() "
                "(the residual writes), or resid.Capture(layers=[3], attn={'z'})."
            )
        tokens = self.as_tokens(inputs)
        capture.validate(self.config.n_layers)
        edits = plan(interventions, self.config, tokens)
        with torch.set_grad_enabled(grad):
            embed, pos_embed, ctx = self._prepare(tokens, memory=self._check_memory(memory, tokens))
            type_embed = self.type_embed(tokens.ids) if self.type_embed is not None else None
            resid = sum(w for w in (embed, pos_embed, type_embed) if w is not None)
            embed_scale = None
            if self.ln_embed is not None:
                resid, embed_scale = self.ln_embed(resid)
            captured = None if capture.positions is None else tokens.padded_index(capture.positions)
            keep = position_selector(captured)
            resid, records = self._blocks(resid, ctx, 0, edits, capture, keep)
            logits, final_scale, uncapped, hidden = self._unembed(resid, tokens, logits_at)

        def kept(write: Tensor | None, wanted: bool = capture.embed) -> Tensor | None:
            return keep(write) if wanted and write is not None else None

        stream = ResidualStream(
            embed_=kept(embed),
            pos_embed_=kept(pos_embed),
            layers=tuple(records),
            final_norm_scale_=kept(final_scale, capture.final_norm_scale),
            parallel=self.config.block == "parallel",
            learned_positions=self.pos_embed is not None,
            captured=captured,
            type_embed_=kept(type_embed),
            embed_norm_scale_=kept(embed_scale),
            norms=self._stream_norms(),
        )
        return Run(logits, stream, tokens, uncapped, hidden)

    def generate(
        self, inputs: Inputs, max_new_tokens: int, interventions: Sequence[Intervention] = (), **options
    ) -> Generation:
        """Greedy (default) or sampled continuation with a KV cache, `interventions` applied at every step.
        options: do_sample, temperature, top_k, seed, stop_at_eos, return_logits (see resid.generate)."""
        return generate(self, inputs, max_new_tokens, interventions, **options)

    def resume(
        self,
        layer: int,
        resid_pre: Float[Tensor, "batch pos d_model"],
        inputs: Inputs,
        interventions: Sequence[Intervention] = (),
        logits_at: LogitsAt = None,
    ) -> Float[Tensor, "batch k d_vocab"]:
        """Logits of a forward pass that starts from `resid_pre` entering `layer` (e.g. a clean run's
        stream.resid_pre(layer)) and runs only layers >= layer. `inputs` gives the mask and positions."""
        n = self.config.n_layers
        if self.config.cross_attention:
            raise ResidError("resume() does not take a decoder with cross-attention yet: run the EncoderDecoder.")
        if not 0 <= layer < n:
            raise ResidError(f"resume(layer={layer}) is out of range: the model has {n} layers (0..{n - 1}).")
        tokens = self.as_tokens(inputs)
        if tuple(resid_pre.shape) != (*tokens.ids.shape, self.config.d_model):
            raise ResidError(
                f"resume got resid_pre of shape {tuple(resid_pre.shape)}, but the tokens need "
                f"{(*tokens.ids.shape, self.config.d_model)} (batch, pos, d_model)."
            )
        edits = plan(interventions, self.config, tokens)
        early = sorted({l for l, _ in edits if l < layer})
        if early:
            raise ResidError(
                f"Interventions at layers {early} come before layer {layer}, where this resumed run starts: "
                "they would have no effect. Apply them in the run that produced resid_pre."
            )
        with torch.no_grad():
            _, _, ctx = self._prepare(tokens, embed=False)
            resid, _ = self._blocks(resid_pre.to(self.dtype), ctx, layer, edits, Capture.none(), None)
            logits, _, _, hidden = self._unembed(resid, tokens, logits_at)
            return hidden if logits is None else logits

    def _check_memory(self, memory: Memory | None, tokens: Tokens) -> Memory | None:
        if not self.config.cross_attention:
            if memory is not None:
                raise ResidError(f"{self.name} has no cross-attention: it takes no memory (encoded source).")
            return None
        if memory is None:
            raise ResidError(
                f"{self.name} is the decoder of an encoder-decoder model: its cross-attention needs the source. Run the "
                "whole model, model.run(source, target) on the resid.EncoderDecoder, or pass memory=encoded source."
            )
        if memory.hidden.shape[0] != tokens.ids.shape[0] or memory.hidden.shape[-1] != self.config.d_model:
            raise ResidError(
                f"The encoded source has shape {tuple(memory.hidden.shape)}, but the decoder needs one row per target "
                f"prompt ({tokens.ids.shape[0]}) of width d_model={self.config.d_model}."
            )
        return memory

    def _prepare(
        self, tokens: Tokens, embed: bool = True, memory: Memory | None = None
    ) -> tuple[Tensor | None, Tensor | None, AttnContext]:
        cfg = self.config
        tok_embed = self.embed(tokens.ids) if embed else None
        pos_embed = self.pos_embed(tokens.position_ids) if embed and self.pos_embed is not None else None
        kinds = cfg.layer_types_used
        rotary = {}
        if self.rotary is not None:
            angles = self.rotary.cos_sin(tokens.position_ids, self.dtype)
            rotary = {kind: angles for kind in kinds}
            if self.rotary_local is not None and "sliding" in kinds:
                rotary["sliding"] = self.rotary_local.cos_sin(tokens.position_ids, self.dtype)
        n_pos, padded = tokens.ids.shape[1], not bool(tokens.attention_mask.all())

        def mask(kind: str) -> Tensor | None:  # None: plain causal, SDPA's causal kernels apply
            window = cfg.window(kind)
            if not padded and (window is None or window >= n_pos):
                return None
            return allowed_keys(tokens.attention_mask, window, cfg.causal)

        ctx = AttnContext.build({kind: mask(kind) for kind in kinds}, rotary, cfg.causal)
        if memory is not None:
            real = memory.mask.to(self.device)
            allowed = None if bool(real.all()) else real[:, None, None, :]
            ctx = dataclasses.replace(ctx, memory=memory.hidden.to(self.dtype), memory_allowed=allowed)
        return tok_embed, pos_embed, ctx

    def _blocks(self, resid: Tensor, ctx: AttnContext, start: int, edits: dict, capture: Capture, keep):
        records = []
        for layer in range(start, self.config.n_layers):
            kept = capture.keeps_layer(layer, self.config.n_layers)
            block = self.blocks[layer]
            want = {part: capture.fields(part) for part in block.parts} if kept else {}
            resid, values = block(resid, ctx, want, {part: edits.get((layer, part), ()) for part in block.parts})
            if keep is not None:
                records.append(self._record(layer, values, keep))
        return resid, records

    def _stream_norms(self) -> StreamNorms | None:
        """Post-LN models: the norms the stream carries its writes through (resid.stream)."""
        if not self.config.post_ln:
            return None
        blocks = self.blocks
        cross = tuple(b.ln_cross_resid for b in blocks) if self.config.cross_attention else None
        return StreamNorms(
            self.ln_embed, tuple(b.ln_attn_resid for b in blocks), tuple(b.ln_mlp_resid for b in blocks), cross
        )

    def _unembed(self, resid: Tensor, tokens: Tokens, logits_at: LogitsAt) -> tuple:
        """(logits or None without a head, the final norm's scale, the logits before a final soft cap or None
        without one, the final hidden state)."""
        readout = self.readout
        normalized, final_scale = readout.normalize(resid)
        index = logit_index(logits_at, tokens)
        if index is not None:
            normalized = normalized.gather(1, index[..., None].expand(-1, -1, normalized.shape[-1]))
        if self.unembed is None:
            return None, final_scale, None, normalized
        uncapped = readout.unembed.raw(normalized if self.mlm_head is None else self.mlm_head(normalized))
        logits = readout.unembed.cap(uncapped)
        if self.dtype in (torch.float16, torch.bfloat16) and not torch.isfinite(logits).all():
            # Half precision overflows silently; a NaN logit would otherwise flow into every analysis.
            raise ResidError(
                f"The forward pass in {self.dtype} produced NaN or infinite logits (an overflow in half "
                "precision). Load the model with dtype=torch.float32 (or bfloat16 if this was float16)."
            )
        return logits, final_scale, (uncapped if readout.unembed.softcap is not None else None), normalized

    def _record(self, layer: int, values: dict[str, dict[str, Tensor]], keep) -> LayerRecord:
        """The captured values of one layer at the kept positions (a cross-attention's keys and values are over
        the source's positions, kept whole)."""
        source = ("k", "v")
        attn = {name: (keep(t, axis=2) if name == "pattern" else keep(t)) for name, t in values["attn"].items()}
        mlp = {name: keep(t) for name, t in values["mlp"].items()}
        attn_absent, mlp_absent = absent_fields(self.config)
        cross = None
        if "cross" in values:
            kept = {name: t if name in source else keep(t, axis=2) if name == "pattern" else keep(t)
                    for name, t in values["cross"].items()}
            cross = CrossRecord(layer, kept, attn_absent)
        return LayerRecord(AttnRecord(layer, attn, attn_absent), MLPRecord(layer, mlp, mlp_absent), cross)
