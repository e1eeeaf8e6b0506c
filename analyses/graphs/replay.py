"""The local replacement model run forward from its node writes: the check that it is the model at this prompt.

    replay(rep)                     every node's write and every constant: the transcoders' inputs and the logits
                                    of the real run (to float32 rounding)
    replay(rep, nodes=False)        the constants alone (biases, b_dec, norm biases, MLP writes that are no node):
                                    each target's bias, the part of its value no node carries

Since the frozen model is affine in the node writes, a target's value is its bias plus the sum of its incoming
edges; tests/graphs checks exactly that, with edges from the transposed maps and biases from this forward pass.
"""

import torch
from torch import Tensor

from resid.analyses.graphs.replacement import Replacement


@torch.no_grad()
def replay(rep: Replacement, nodes: bool = True, constants: bool = True) -> tuple[list[Tensor], Tensor]:
    """(per layer the transcoder's input [pos d_in], the logits before any final soft cap [pos d_vocab])."""
    frozen, found = rep.frozen, rep.transcoders
    resid = rep.embed if nodes else torch.zeros_like(rep.embed)
    inputs = []
    for layer in range(rep.n_layers):
        attn = frozen.attn_forward(layer, resid, constants)
        read = resid if frozen.parallel else resid + attn
        x = frozen.input_forward(layer, read, constants)
        inputs.append(x)
        y = torch.zeros_like(rep.errors[layer])
        if nodes:
            y = y + rep.errors[layer] + _feature_writes(rep, layer)
        if constants:
            y = y + found.b_dec(layer) + rep.fixed[layer]
        if frozen.skips[layer] is not None:
            y = y + x @ frozen.skips[layer]
        write = frozen.write_forward(layer, y, constants)
        resid = resid + attn + write if frozen.parallel else read + write
    normalized = frozen.final_forward(resid, constants)
    unembed = rep.frozen.model.readout.unembed
    logits = normalized @ unembed.weight.detach().float().T
    if constants and unembed.b_U is not None:
        logits = logits + unembed.b_U.detach().float()
    return inputs, logits


def _feature_writes(rep: Replacement, target: int) -> Tensor:
    """What every active feature writes into layer `target`'s MLP output space [pos d_out]."""
    out = torch.zeros_like(rep.errors[target])
    found = rep.transcoders
    for source in range(target + 1):
        if target not in found.targets(source):
            continue
        rows = (rep.features[:, 0] == source).nonzero().flatten()
        if not len(rows):
            continue
        positions, features = rep.features[rows, 1], rep.features[rows, 2]
        weights = found.decoder(source, target, features) * rep.activations[rows, None]
        out.index_add_(0, positions.to(out.device), weights)  # the bookkeeping (rep.features) is on the CPU
    return out
