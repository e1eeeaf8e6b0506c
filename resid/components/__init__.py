"""The building blocks of a Transformer: embeddings, norms, rotary, attention, MLP, block.

A model may be built on PyTorch's meta device (the safetensors loader does, so that an 8B model costs no memory
until its checkpoint's tensors arrive, rather than 32 GB of float32 zeros first). What a block computes from its
config instead of reading from a checkpoint (rotary frequencies, sinusoid tables, a norm's initial gain) is built
under `computed()`: on a real device even then, so that it survives such a build.
"""

import torch


def computed() -> torch.device:
    """The device (a context manager) for values computed at construction: the default device, or the CPU where
    the default is the meta device."""
    device = torch.get_default_device()
    return torch.device("cpu") if device.type == "meta" else device
