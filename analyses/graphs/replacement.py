"""One prompt's run with its MLPs replaced by transcoders: its frozen values (resid.analyses.graphs.frozen) and the
graph's nodes.

    nodes    token embeddings (one per position: every embedding write summed), active features (layer, position,
             feature) with their activation, error nodes (one per layer and position: the MLP's true write minus
             the transcoder's reconstruction, in the transcoder's output space) and logit nodes (chosen later)
    values   a feature node's value is its pre-activation; a logit node's is its logit minus the mean logit over
             the vocabulary (before a final soft cap), as circuit-tracer defines its logit targets

The run splices every transcoder with its error kept (resid.dictionaries.Splice), so it is the model's own run to
float32 rounding, and records every pattern and norm scale the frozen blocks need (Block.frozen_sites).

The replacement model of layer l is the model's block with those values frozen (Block.frozen / frozen_adjoint) and
the MLP sublayer replaced by its transcoder: x = what the transcoder reads from the residual the MLP reads
(`transcoder_input`: the MLP's pre-norm output, its standardized form, or the residual itself), y = its output
(feature writes, b_dec, skip path x @ W_skip, error), which is the MLP's whole write (a transcoder writing before
a post-norm is refused when the run splices it).
"""

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from resid.analyses.graphs.frozen import Frozen
from resid.analyses.graphs.transcoders import Transcoders
from resid.capture import Capture
from resid.errors import ResidError


@dataclass
class Replacement:
    model: object  # the resid.Transformer whose blocks the replacement model runs
    frozen: Frozen
    transcoders: Transcoders
    token_ids: Tensor  # [pos]
    embed: Tensor  # [pos d_model]: the embedding writes summed
    features: Tensor  # [n 3] (layer, position, feature), sorted
    activations: Tensor  # [n]
    pre_activations: Tensor  # [n]
    errors: Tensor  # [layer pos d_out]
    fixed: Tensor  # [layer pos d_out]: MLP writes that are no node (position 0's with skip_bos), constants
    inputs: list[Tensor]  # per layer [pos d_in]: what the transcoder read
    logits: Tensor  # [d_vocab] at the last position, after any final soft cap
    uncapped: Tensor  # [d_vocab] before it (== logits without a cap)
    skip_bos: bool = False
    run: object = None  # the spliced run itself (resid.Run): what `replace(capture=...)` also recorded

    @property
    def n_pos(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def n_layers(self) -> int:
        return self.transcoders.n_layers

    def transcoder_input(self, layer: int, resid: Tensor, frozen: Frozen, constants: bool = True) -> Tensor:
        """x: layer's transcoder input [pos d_in] from the residual the MLP reads [pos d_model]."""
        point = self.transcoders.points_in[layer]
        if point.site.what != "normalized":  # the residual itself
            return resid.float()
        block = self.model.blocks[layer]
        return block.frozen_pre("mlp", resid, frozen.values, constants, standardized=point.standardized)

    def transcoder_input_adjoint(self, layer: int, w: Tensor, frozen: Frozen,
                                 positions: Tensor | None = None) -> Tensor:
        """The adjoint of `transcoder_input`'s linear part: from w on the transcoder's input ([... pos d_in], or one
        row per position in `positions`: e.g. encoder columns at their targets' positions) to the residual the MLP
        reads."""
        point = self.transcoders.points_in[layer]
        if point.site.what != "normalized":
            return w.float()
        block = self.model.blocks[layer]
        return block.frozen_pre_adjoint("mlp", w, frozen.values, positions, standardized=point.standardized)


def replace(model, prompt, transcoders, skip_bos: bool | None = None, capture: Capture | None = None,
            store_patterns: bool = False) -> Replacement:
    """Run `prompt` (text or token ids, one prompt) with every MLP replaced by `transcoders` (checked: see
    Transcoders.of). skip_bos: position 0's features and errors are no nodes, their writes are constants, as
    circuit-tracer does for position 0 (None: when the prompt starts with the tokenizer's BOS token). `capture`:
    fields the run records besides the frozen values (Replacement.run keeps them), e.g. heads' z and q_proj for
    QK attribution. store_patterns: keep every layer's pattern (pos^2 memory) instead of rebuilding each from the
    run's queries and keys when a map reads it (resid.analyses.graphs.frozen)."""
    found = Transcoders.of(model, transcoders)
    config = model.config
    if isinstance(prompt, str):
        prompt = [prompt]
    elif isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], int):
        prompt = torch.tensor([prompt])
    elif isinstance(prompt, Tensor) and prompt.ndim == 1:
        prompt = prompt[None]
    tokens = model.as_tokens(prompt)
    if tokens.ids.shape[0] != 1:
        raise ResidError(f"An attribution graph explains one prompt; got {tokens.ids.shape[0]}.")
    with torch.no_grad():
        run = model.run(tokens, capture=_with(Frozen.capture(model, store_patterns), capture),
                        dictionaries=found.splices())
    stream = run.stream
    n = config.n_layers
    frozen = Frozen.of(model, run, store_patterns)
    embed = stream.embed[0].float()
    for extra in (stream.pos_embed, stream.type_embed):
        if extra is not None:
            embed = embed + extra[0].float()
    acts, errors, inputs = found.record(run)
    if skip_bos is None:
        bos = getattr(getattr(model, "tokenizer", None), "bos_token_id", None)
        skip_bos = bos is not None and int(tokens.ids[0, 0]) == bos
    fixed = torch.zeros_like(torch.stack(errors))
    rows, values, pre = [], [], []
    for layer in range(n):
        a = acts[layer].clone()
        if skip_bos:
            a[0] = 0
        index = a.nonzero()  # [m 2] (position, feature), sorted; kept on the CPU as the graph's bookkeeping
        rows.append(torch.cat([torch.full((len(index), 1), layer), index.cpu()], dim=1))
        values.append(a[index[:, 0], index[:, 1]])
        # every position's pre-activations once, then the active ones: [pos d_sae], not one row per active feature
        pre.append(found.pre_activations(layer, inputs[layer])[index[:, 0], index[:, 1]])
        if skip_bos:  # position 0's MLP write (its features' and its error) becomes a constant
            fixed[layer, 0] = errors[layer][0] + _written(found, acts, layer, 0)
            errors[layer] = errors[layer].clone()
            errors[layer][0] = 0
    logits = run.logits[0, -1].float()
    uncapped = run.uncapped_logits[0, -1].float() if run.uncapped_logits is not None else logits
    return Replacement(model, frozen, found, tokens.ids[0], embed, torch.cat(rows).long(), torch.cat(values).float(),
                       torch.cat(pre).float(), torch.stack(errors), fixed, inputs, logits, uncapped, skip_bos,
                       run if capture is not None else None)  # a graph alone keeps no run: its memory


def _with(base: Capture, extra: Capture | None) -> Capture:
    """`base` plus the sublayer fields of `extra` (every layer and position)."""
    if extra is None:
        return base
    return dataclasses.replace(base, attn=base.attn | extra.attn, mlp=base.mlp | extra.mlp,
                               embed=base.embed or extra.embed)


def _written(found: Transcoders, acts: list[Tensor], target: int, position: int) -> Tensor:
    """What the features at `position` of every source layer write into `target`'s MLP write."""
    total = 0
    for source in range(target + 1):
        if target not in found.targets(source):
            continue
        a = acts[source][position]
        active = a.nonzero().flatten()
        if len(active):
            total = total + a[active] @ found.decoder(source, target, active)
    return total
