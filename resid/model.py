"""Transformer: embedding -> blocks -> final norm -> unembed, whose `run` records the residual stream.

    run = model.run(["The Eiffel Tower is in"], capture=resid.Capture.all(), interventions=[...])
    run.logits            # [batch pos d_vocab]
    run.stream            # ResidualStream: typed writes, resid_pre/mid/post, components()

No weight processing happens by default: the logits equal Hugging Face's for the same weights.
"""

import dataclasses
from collections.abc import Sequence
from pathlib import Path

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
from resid.records import AttnRecord, CrossRecord, LayerRecord, MLPRecord, absent_fields
from resid.run import CaptureArg, Inputs, Memory, Run, TokenInputs, check_memory
from resid.selection import LogitsAt, logit_index, position_selector
from resid.stream import ResidualStream, StreamNorms
from resid.tokenizer import Tokenizer, Tokens

__all__ = ["CaptureArg", "Inputs", "Memory", "Run", "Transformer"]  # Run and its inputs live in resid.run


class Transformer(TokenInputs, nn.Module):
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
            embed, pos_embed, ctx = self._prepare(tokens, memory=check_memory(self, memory, tokens))
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

    def attention_pattern(
        self,
        layer: int,
        q: Float[Tensor, "batch pos head d_head"],
        k: Float[Tensor, "batch pos kv_head d_head"],
        inputs: Inputs,
    ) -> Float[Tensor, "batch head pos key_pos"]:
        """The pattern `layer`'s self-attention computes from these queries and keys (as a run captures them:
        after rotary) over the masks of `inputs` (causal, padding, sliding window, soft-capping as the layer
        has them): e.g. a head's pattern with another prompt's queries and this prompt's keys."""
        n = self.config.n_layers
        if not 0 <= layer < n:
            raise ResidError(f"attention_pattern(layer={layer}) is out of range: the model has {n} layers.")
        _, _, ctx = self._prepare(self.as_tokens(inputs), embed=False)
        attn = self.blocks[layer].attn
        return attn.pattern_of(q.to(self.dtype).transpose(1, 2), k.to(self.dtype).transpose(1, 2), ctx)

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
