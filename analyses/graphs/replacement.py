"""One prompt's run with its MLPs replaced by transcoders: the frozen linear maps (resid.analyses.graphs.frozen) and
the graph's nodes.

    nodes    token embeddings (one per position: every embedding write summed), active features (layer, position,
             feature) with their activation, error nodes (one per layer and position: the MLP's true write minus
             the transcoder's reconstruction, in the transcoder's output space) and logit nodes (chosen later)
    values   a feature node's value is its pre-activation; a logit node's is its logit minus the mean logit over
             the vocabulary (before a final soft cap), as circuit-tracer defines its logit targets

The run splices every transcoder with its error kept (resid.dictionaries.Splice), so it is the model's own run to
float32 rounding, and records every pattern and norm scale the frozen maps need.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from resid.analyses.graphs.frozen import Frozen
from resid.analyses.graphs.transcoders import Transcoders
from resid.capture import Capture
from resid.errors import ResidError


@dataclass
class Replacement:
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

    @property
    def n_pos(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def n_layers(self) -> int:
        return self.frozen.n_layers


def replace(model, prompt, transcoders, skip_bos: bool | None = None) -> Replacement:
    """Run `prompt` (text or token ids, one prompt) with every MLP replaced by `transcoders` (checked: see
    Transcoders.of). skip_bos: position 0's features and errors are no nodes, their writes are constants, as
    circuit-tracer does for position 0 (None: when the prompt starts with the tokenizer's BOS token)."""
    found = Transcoders.of(model, transcoders)
    config = model.config
    attn, mlp = {"pattern"}, set()
    if config.pre_norms:
        attn.add("norm_scale")
        mlp.add("norm_scale")
    if config.post_norms:
        attn.add("post_norm_scale")
        mlp.add("post_norm_scale")
    capture = Capture(attn=attn, mlp=mlp, embed=True, final_norm_scale=True)
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
        run = model.run(tokens, capture=capture, dictionaries=found.splices())
    stream = run.stream
    n = config.n_layers
    scales = {}
    for layer in range(n):
        record = stream.layers[layer]
        if config.pre_norms:
            scales[(layer, "attn")] = record.attn.norm_scale[0].float()
            scales[(layer, "mlp")] = record.mlp.norm_scale[0].float()
        if config.post_norms:
            scales[(layer, "attn_post")] = record.attn.post_norm_scale[0].float()
            scales[(layer, "mlp_post")] = record.mlp.post_norm_scale[0].float()
    frozen = Frozen(model, [stream.layers[l].attn.pattern[0].float() for l in range(n)], scales,
                    stream.final_norm_scale[0].float(), [found.read(l) for l in range(n)],
                    [found.points_out[l].before_post_norm for l in range(n)], [found.skip(l) for l in range(n)])
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
        pre.append(found.pre_activations(layer, inputs[layer][index[:, 0]]).gather(1, index[:, 1:]).flatten())
        if skip_bos:  # position 0's MLP write (its features' and its error) becomes a constant
            fixed[layer, 0] = errors[layer][0] + _written(found, acts, layer, 0)
            errors[layer] = errors[layer].clone()
            errors[layer][0] = 0
    logits = run.logits[0, -1].float()
    uncapped = run.uncapped_logits[0, -1].float() if run.uncapped_logits is not None else logits
    return Replacement(frozen, found, tokens.ids[0], embed, torch.cat(rows).long(), torch.cat(values).float(),
                       torch.cat(pre).float(), torch.stack(errors), fixed, inputs, logits, uncapped, skip_bos)


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
