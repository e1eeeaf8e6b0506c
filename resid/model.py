"""Transformer: embedding -> blocks -> final norm -> unembed, whose `run` records the residual stream.

    run = model.run(["The Eiffel Tower is in"], capture=resid.Capture.all(), interventions=[...])
    run.logits            # [batch pos d_vocab]
    run.stream            # ResidualStream: typed writes, resid_pre/mid/post, components()

No weight processing happens by default: the logits equal Hugging Face's for the same weights.
"""

from collections.abc import Sequence
from pathlib import Path

import torch
from jaxtyping import Float
from torch import Tensor, nn

from resid import forward
from resid.attachments import attach
from resid.capture import Capture
from resid.components.attention import AttnContext
from resid.components.block import Block
from resid.components.embed import Embed, PosEmbed, TokenTypeEmbed, Unembed
from resid.components.head import MLMHead
from resid.components.norm import Norm
from resid.components.relative import RelativeBias
from resid.components.rotary import Rotary
from resid.config import LayerType, ModelConfig
from resid.errors import ResidError
from resid.generate import Generation, generate
from resid.interventions import Intervention, group_edits
from resid.readout import Readout
from resid.run import CaptureArg, Inputs, Memory, Run, TokenInputs, check_memory
from resid.selection import LogitsAt, position_selector
from resid.stream import ResidualStream, StreamNorms
from resid.tokenizer import Tokenizer

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
        self.relative = RelativeBias(config) if config.positions == "relative" else None  # T5
        self.blocks = nn.ModuleList(Block(config, layer) for layer in range(config.n_layers))
        self.ln_final = Norm(config, multiplier=config.final_norm_multiplier) if config.final_norm else None
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

    def rotary_of(self, layer_type: LayerType) -> Rotary | None:
        """The rotary that turns the queries and keys of the self-attention layers of `layer_type` ("full" |
        "sliding": Attention.layer_type); None without rotary positions. Gemma 3's sliding layers turn with their
        own (local, unscaled) base. Its cos_sin(position_ids, dtype) gives the angles, Rotary.apply turns by them."""
        if layer_type == "sliding" and self.rotary_local is not None:
            return self.rotary_local
        return self.rotary

    def forward(self, inputs: Inputs) -> Float[Tensor, "batch pos out"]:
        """Logits [batch pos d_vocab] of texts (left-padded), Tokens, or ids [batch pos] / [pos], recording
        nothing, without gradients and without interventions: `model(inputs)` as a plain nn.Module (an embedding
        model gives its final hidden state [batch pos d_model]). For the stream, interventions, gradients or
        logits at chosen positions use `run`."""
        run = self.run(inputs, capture=Capture.none())
        return run.logits if run.has_logits else run.hidden

    def run(
        self,
        inputs: Inputs,
        capture: CaptureArg = None,
        interventions: Sequence[Intervention] = (),
        grad: bool = False,
        logits_at: LogitsAt = None,
        memory: Memory | None = None,
        check_finite: bool = True,
        dictionaries: Sequence = (),
        stop_at_layer: int | None = None,
    ) -> Run:
        """Forward pass recording what `capture` asks for (default: the residual writes), with
        `interventions` applied. Gradients are off unless grad=True.

        logits_at: None for logits at every position; "last" for each prompt's last real token; a list of
        prompt-relative positions (the same for every prompt), a [batch] / [batch k] tensor of prompt-relative
        positions (one row per prompt), or resid.Padded(index) for indices of the padded batch. run.logits is
        then [batch k d_vocab]: the unembedding (often the largest matmul) runs only where it is needed.

        memory: decoders of encoder-decoder models only, the encoded source their cross-attention reads (one row
        per prompt); resid.EncoderDecoder.run passes it.

        check_finite: a NaN or infinity in the final hidden state (or in half-precision logits) is an error naming
        the first site that went non-finite; False returns the values as they are.

        dictionaries: learned dictionaries (resid.dictionaries) to apply: a Dictionary observes (the model runs
        unchanged), resid.dictionaries.Splice(d) replaces the tensor it reconstructs by reconstruction + error
        (error=False: by the reconstruction alone). What each computed is `run.dictionaries[name]`. The core
        attaches them through resid.attachments, knowing no dictionary code.

        stop_at_layer: run layers 0..stop_at_layer-1 only (as TransformerLens names it), for reading early
        layers of a deep model: no final norm, no logits (run.has_logits is False), run.hidden is the residual after
        the last layer run, and the stream has that many layers."""
        capture = Capture() if capture is None else capture
        if not isinstance(capture, Capture):
            raise ResidError(
                f"capture must be a resid.Capture, got {capture!r}: e.g. resid.Capture.all(), resid.Capture() "
                "(the residual writes), or resid.Capture(layers=[3], attn={'z'})."
            )
        tokens = self.as_tokens(inputs)
        attached = None
        if dictionaries:
            attached = attach(self, dictionaries, grad)
            capture, interventions = attached.capture(capture), attached.interventions(interventions)
        capture.validate(self.config.n_layers)
        n = self.config.n_layers
        if stop_at_layer is not None and (isinstance(stop_at_layer, bool) or not isinstance(stop_at_layer, int)
                                          or not 0 <= stop_at_layer <= n):
            raise ResidError(f"stop_at_layer={stop_at_layer!r} must be a whole number of layers in 0..{n} ({self.name} "
                             f"has {n}), or None to run them all.")
        edits = group_edits(interventions, self.config, tokens)
        end = n if stop_at_layer is None else stop_at_layer
        past = sorted({site.layer for site in edits if site.layer is not None and site.layer >= end})
        if past:
            raise ResidError(f"Interventions at layer(s) {past} lie past stop_at_layer={stop_at_layer}: the run stops "
                             "before them. Raise stop_at_layer or drop them.")
        captured = None if capture.positions is None else tokens.padded_index(capture.positions)
        keep = position_selector(captured)
        with torch.set_grad_enabled(grad):
            ctx = forward.context(self, tokens, check_memory(self, memory, tokens))
            done = forward.forward(self, tokens, edits, capture, keep, ctx=ctx, logits_at=logits_at,
                                   check=check_finite, stop=stop_at_layer)

        def kept(write: Tensor | None, wanted: bool = capture.embed) -> Tensor | None:
            return keep(write) if wanted and write is not None else None

        stream = ResidualStream(
            embed_=kept(done.embeddings["embed"]),
            pos_embed_=kept(done.embeddings.get("pos_embed")),
            layers=tuple(done.records),
            final_norm_scale_=kept(done.final_scale, capture.final_norm_scale),
            parallel=self.config.block == "parallel",
            learned_positions=self.pos_embed is not None,
            captured=captured,
            type_embed_=kept(done.embeddings.get("type_embed")),
            embed_norm_scale_=kept(done.embed_scale),
            norms=self._stream_norms(),
            config=self.config,
        )
        run = Run(done.logits, stream, tokens, done.uncapped, done.hidden, no_logits=self._no_logits(stop_at_layer))
        return run if attached is None else attached.finish(run)

    def generate(
        self, inputs: Inputs, max_new_tokens: int, interventions: Sequence[Intervention] = (), **options
    ) -> Generation:
        """Greedy (default) or sampled continuation with a KV cache, `interventions` applied at every step.
        options: do_sample, temperature, top_k, seed, stop_at_eos, return_logits (see resid.generate)."""
        return generate(self, inputs, max_new_tokens, interventions, **options)

    def attention_context(self, inputs: Inputs) -> AttnContext:
        """The masks (causal, padding, sliding windows) and rotary angles every attention layer of a pass over
        `inputs` shares, checked and made once (attention_pattern takes it)."""
        return forward.context(self, self.as_tokens(inputs))

    def attention_pattern(
        self,
        layer: int,
        q: Float[Tensor, "batch pos head d_head"],
        k: Float[Tensor, "batch pos kv_head d_head"],
        inputs: Inputs | AttnContext,
    ) -> Float[Tensor, "batch head pos key_pos"]:
        """The pattern `layer`'s self-attention computes from these queries and keys (as a run captures them:
        after rotary) over the masks of `inputs` (causal, padding, sliding window, soft-capping as the layer
        has them): e.g. a head's pattern with another prompt's queries and this prompt's keys. A caller that
        rebuilds several layers' patterns over one input passes its `attention_context(inputs)` instead, made once:
        the input's checks and masks are then not made again per layer."""
        n = self.config.n_layers
        if not 0 <= layer < n:
            raise ResidError(f"attention_pattern(layer={layer}) is out of range: the model has {n} layers.")
        ctx = inputs if isinstance(inputs, AttnContext) else self.attention_context(inputs)
        attn = self.blocks[layer].attn
        return attn.pattern_of(q.to(self.dtype).transpose(1, 2), k.to(self.dtype).transpose(1, 2), ctx)

    def resume(
        self,
        layer: int,
        resid_pre: Float[Tensor, "batch pos d_model"],
        inputs: Inputs,
        interventions: Sequence[Intervention] = (),
        logits_at: LogitsAt = None,
        memory: Memory | None = None,
    ) -> Float[Tensor, "batch k d_vocab"]:
        """Logits of a forward pass that starts from `resid_pre` entering `layer` (e.g. a clean run's
        stream.resid_pre(layer)) and runs only layers >= layer. `inputs` gives the mask and positions; `memory`
        the encoded source of a decoder with cross-attention (as in run). Returns the logits tensor, not a Run (as
        `model(inputs)` does; an embedding model's final hidden state): a resumed pass records no stream, since
        the layers before `layer` never ran; for the stream, run with interventions instead."""
        n = self.config.n_layers
        if not 0 <= layer < n:
            raise ResidError(f"resume(layer={layer}) is out of range: the model has {n} layers (0..{n - 1}).")
        tokens = self.as_tokens(inputs)
        if tuple(resid_pre.shape) != (*tokens.ids.shape, self.config.d_model):
            raise ResidError(
                f"resume got resid_pre of shape {tuple(resid_pre.shape)}, but the tokens need "
                f"{(*tokens.ids.shape, self.config.d_model)} (batch, pos, d_model)."
            )
        edits = group_edits(interventions, self.config, tokens)
        early = sorted({site.layer for site in edits if site.layer is None or site.layer < layer},
                       key=lambda l: -1 if l is None else l)
        if early:
            raise ResidError(
                f"Interventions at layers {early} come before layer {layer}, where this resumed run starts: "
                "they would have no effect. Apply them in the run that produced resid_pre."
            )
        with torch.no_grad():
            ctx = forward.context(self, tokens, check_memory(self, memory, tokens))
            done = forward.forward(self, tokens, edits, Capture.none(), None, start=layer,
                                   resid=resid_pre.to(self.dtype), ctx=ctx, logits_at=logits_at)
            return done.hidden if done.logits is None else done.logits

    def _no_logits(self, stop_at_layer: int | None) -> str:
        """Why a run of this model has no logits, and what to read instead."""
        if self.config.head == "none":
            return (f"{self.name} is an embedding model (no LM head), so its runs have no logits. Read run.hidden, "
                    "the final hidden state [batch pos d_model] (mean-pool it over the real tokens for a sentence "
                    "embedding, as sentence-transformers does), or run.stream.final(), the residual before the final "
                    "norm.")
        return (f"This run stopped before layer {stop_at_layer} (stop_at_layer), so it has no logits. Read "
                "run.hidden (the residual it stopped at), or run without stop_at_layer.")

    def _stream_norms(self) -> StreamNorms | None:
        """Post-LN models: the norms the stream carries its writes through (resid.stream)."""
        if not self.config.post_ln:
            return None
        blocks = self.blocks
        cross = tuple(b.ln_cross_resid for b in blocks) if self.config.cross_attention else None
        return StreamNorms(
            self.ln_embed, tuple(b.ln_attn_resid for b in blocks), tuple(b.ln_mlp_resid for b in blocks), cross
        )
