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
    """(per layer the transcoder's input [pos d_in], the logits before any final soft cap [pos d_vocab]): the
    model's own blocks with their frozen values (Block.frozen), each MLP replaced by its transcoder's write."""
    frozen, found, model = rep.frozen, rep.transcoders, rep.model
    resid = rep.embed if nodes else torch.zeros_like(rep.embed)
    inputs = []

    def transcoder(layer: int):
        skip = found.skip(layer)

        def write(read: Tensor) -> Tensor:
            """What layer's transcoder writes, from the residual the MLP reads."""
            x = rep.transcoder_input(layer, read, frozen, constants)
            inputs.append(x)
            y = torch.zeros_like(rep.errors[layer])
            if nodes:
                y = y + rep.errors[layer] + _feature_writes(rep, layer)
            if constants:
                y = y + found.b_dec(layer) + rep.fixed[layer]
            return y + x @ skip if skip is not None else y
        return write

    for layer, block in enumerate(model.blocks):
        resid = block.frozen(resid, frozen.values, transcoder(layer), constants)
    normalized = model.readout.frozen(resid, frozen.final_scale, constants)
    return inputs, model.readout.unembed.frozen(normalized, constants)


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
