"""Copying checkpoint tensors into a Transformer through an explicit key table, asserting every shape.

A `Key` says where one checkpoint tensor goes: `attribute` is an attribute path on the model in resid's
public per-head names ("blocks.{layer}.attn.W_Q"), `checkpoint` the checkpoint's name, and `pattern` an einops
rearrangement from the checkpoint's layout to resid's (this is where layouts are documented: Hugging Face's
q_proj rows are `(head d_head)`, GPT-2's Conv1D weights are transposed, ...). A fused checkpoint tensor is split with
`pick` when its parts are equal (GPT-2's c_attn, GPT-NeoX's query_key_value) or with `rows`, a row range
taken first, when they are not (Phi-3's qkv_proj under grouped-query attention, its gate_up_proj).

A model built on the meta device (the safetensors loader builds one so) gets its parameters here: a checkpoint
tensor already in the parameter's dtype and layout becomes the parameter itself (no copy: for a memory-mapped
safetensors file, its pages are the weights, read from disk as they are first used, so resident memory stays about
the weights' size); any other is copied into memory of the parameter's own; a parameter no key writes is zeros, as
a model built on a real device starts.
"""

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import einops
import torch
from torch import Tensor

from resid import batching
from resid.config import ModelConfig
from resid.errors import ResidError, param


@dataclass(frozen=True)
class Key:
    attribute: str  # attribute path on the model, with {layer}
    checkpoint: str  # checkpoint tensor name, with {layer}
    pattern: str | None = None  # einops pattern: checkpoint layout -> resid layout
    pick: int | None = None  # after rearranging, take this index of the leading axis (fused q/k/v)
    # before rearranging, take rows [start, stop) of a tensor that must have exactly `total` rows (fused tensors)
    rows: tuple[int, int, int] | None = None  # (start, stop, total)
    # then take the rows in this order (interleaved rotary pairs (2i, 2i + 1) regathered into rotate_half's halves:
    # the same scores, each head's q and k dims permuted alike, resid.load.families.rotary_halves; with `rows`, a
    # subset of them: Falcon's query rows, interleaved with its key and value rows per group)
    order: tuple[int, ...] | None = None
    scale: float = 1.0  # the tensor multiplied by this (a constant multiplier of the family folded into a weight)


def per_layer(keys: Iterable[Key], n_layers: int) -> list[Key]:
    """Expand `{layer}` in every key, once per layer (keys without it are kept once)."""
    out = []
    for key in keys:
        if "{layer}" in key.attribute:
            out += [
                dataclasses.replace(key, attribute=key.attribute.format(layer=l),
                                    checkpoint=key.checkpoint.format(layer=l))
                for l in range(n_layers)
            ]
        else:
            out.append(key)
    return out


def model_values(config: ModelConfig) -> int:
    """The weight values a model of `config` holds, near enough for a bound: its matrices (attention, latent
    attention's projections, MLP or experts, DeepSeek's dense first layers, embedding and unembedding, learned
    positions) and the sinusoid table resid computes itself."""
    d_model = config.d_model
    attn = 2 * d_model * config.d_head * (config.n_heads + config.n_kv_heads)
    if config.kv_rank:  # W_DKV, W_UKV (every head's no-rope key and value), the query (latent or not), W_O
        rot, heads = config.rotary_dims, config.n_heads
        query = config.q_rank * (d_model + heads * config.d_head) if config.q_rank else d_model * heads * config.d_head
        attn = (d_model * (config.kv_rank + rot) + config.kv_rank * heads * (config.d_head - rot + config.v_width)
                + query + heads * config.v_width * d_model)
    gates = 3 if config.gated_mlp else 2
    dense, d_dense = config.n_dense_layers, config.d_mlp_dense or config.d_mlp  # dense layers: experts only
    mlps = gates * d_model * (dense * d_dense + (config.n_layers - dense) * config.d_mlp * max(config.n_experts, 1))
    embeddings = config.d_vocab * d_model * (1 if config.tie_embeddings or config.head == "none" else 2)
    positions = config.n_ctx * d_model if config.positions in ("learned", "sinusoidal") else 0
    return config.n_layers * attn * (2 if config.cross_attention else 1) + mlps + embeddings + positions


def check_size(configs: Iterable[ModelConfig], in_files: int, where: str) -> None:
    """Before anything of a config's size is allocated (or its key table expanded): refuse a config that describes
    far more values than the weight files hold. The stated bound: at most 4x the files' values plus 16M, so a
    config of plausible size goes on to `assign`, which checks every tensor's shape exactly, and an implausible
    one (num_hidden_layers: 10000000, vocab_size: 10**12) costs no memory."""
    configs = list(configs)
    wanted = sum(model_values(config) for config in configs)
    if wanted > 4 * in_files + 2**24:
        sizes = "; ".join(
            f"n_layers={c.n_layers}, d_model={c.d_model}, d_mlp={c.d_mlp}, d_vocab={c.d_vocab}, n_ctx={c.n_ctx}"
            + (f", n_experts={c.n_experts}" if c.n_experts else "")
            + (f", kv_rank={c.kv_rank}, q_rank={c.q_rank}" if c.kv_rank else "") for c in configs
        )
        raise ResidError(
            f"The config of {where} describes a model of about {wanted:,} weight values ({sizes}), but the weight "
            f"files hold {in_files:,}. A size in config.json is wrong (num_hidden_layers, hidden_size, "
            "intermediate_size, vocab_size, max_position_embeddings, kv_lora_rank, ...); resid refuses before "
            "allocating it. Fix config.json or re-export the model."
        )


def check_fits(in_files: int, dtype: torch.dtype, device: torch.device, where: str,
               address_space: int | None = None) -> None:
    """Before loading: refuse a model whose weights (the files' values in `dtype`) exceed the memory `device` has
    available (on the CPU the least of the host's available memory and this process's limits), naming the size
    needed, rather than be killed by the kernel or CUDA half-way. address_space: the host address space the
    load will take beyond what the process maps now (the weight files, mapped whole, and the copies made of tensors
    not stored in `dtype`), refused when an address-space limit (ulimit -v) leaves less: past it, mmap and malloc
    fail with a MemoryError."""
    need, free = in_files * dtype.itemsize, batching.available_bytes(device)
    gib = lambda n: f"{n / 2**30:.1f} GiB"  # noqa: E731
    smaller = (f" In bfloat16 it would take {gib(in_files * 2)} ({param('dtype', 'bfloat16')})."
               if dtype.itemsize > 2 else "")
    left = batching.memory_limits()[0]  # the files are mapped on the host whatever the device
    if address_space is not None and left is not None and address_space > left:
        raise ResidError(
            f"Loading {where} maps its weight files and copies what is not stored in {str(dtype).split('.')[-1]}: "
            f"{gib(address_space)} of address space, but this process's address-space limit (ulimit -v, RLIMIT_AS) "
            f"leaves {gib(left)}. Raise the limit (ulimit -v unlimited) or load the model in the dtype its files "
            "hold (no copies)."
        )
    if free is None or need <= free:
        return
    raise ResidError(
        f"{where[:1].upper() + where[1:]} needs {gib(need)} for its weights in {str(dtype).split('.')[-1]}, but the "
        f"{device.type.upper()} has {gib(free)} available"
        + (" (the least of the host's available memory and this process's limits: ulimit -v, its cgroup's memory "
           "limit)" if device.type == "cpu" else "")
        + f".{smaller} Load it in a smaller dtype, on a device with more memory, or free memory first."
    )


def axis_sizes(config: ModelConfig) -> dict[str, int]:
    # shared: DeepSeek's shared experts, fused in one MLP the key table splits
    return {"head": config.n_heads, "kv_head": config.n_kv_heads, "d_head": config.d_head, "three": 3, "two": 2,
            "shared": config.n_shared_experts}


def tensor_at(model: torch.nn.Module, path: str) -> Tensor:
    """The parameter of `model` at a key table's target path ("blocks.3.attn.W_Q")."""
    obj = model
    for part in path.split("."):
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    if not isinstance(obj, Tensor):
        raise ResidError(f"Internal key table error: {path} is not a tensor of the model ({type(obj).__name__}).")
    return obj


def assign(
    model: torch.nn.Module,
    keys: list[Key],
    get: Callable[[str], Tensor | None],
    available: Mapping[str, str],
    ignore: Iterable[str] = (),
    where: str = "the checkpoint",
    share: bool = False,
) -> None:
    """Copy every key's checkpoint tensor into its attribute. Missing, mis-shaped and unexpected tensors are errors.
    `available` maps each tensor's table name to its name in the file (shown in messages). share: a tensor in its
    parameter's dtype and layout becomes the parameter (for writable memory-mapped files: safetensors maps them
    copy-on-write), as it must for a parameter still on the meta device."""
    sizes = axis_sizes(model.config)
    used = set()
    parameters = _Parameters(model)
    with torch.no_grad():
        for key in keys:
            tensor = get(key.checkpoint)
            if tensor is None:
                raise ResidError(
                    f"{where[:1].upper() + where[1:]} has no tensor {key.checkpoint!r} (needed for {key.attribute}). "
                    "The file is incomplete or "
                    "belongs to a different architecture or size than its config.json says; re-export it."
                )
            used.add(key.checkpoint)
            value = _rearrange(tensor, key, sizes, f"In {where}")
            attribute = tensor_at(model, key.attribute)
            if tuple(value.shape) != tuple(attribute.shape):
                layout = f" (laid out as '{key.pattern}', that is {tuple(value.shape)})" if key.pattern else ""
                raise ResidError(
                    f"In {where}, tensor {available.get(key.checkpoint, key.checkpoint)!r} has shape "
                    f"{tuple(tensor.shape)}{layout}, but {key.attribute} is {tuple(attribute.shape)} for this config. "
                    "The weights do not match their config; re-export them."
                )
            parameter = attribute if attribute._base is None else attribute._base
            if ((share or parameter.is_meta) and parameters.takes(parameter, tensor)
                    and _same_layout(tensor, value, parameter, attribute)):
                parameters.replace(parameter, tensor)
                continue
            if parameter.is_meta:
                parameters.replace(parameter, torch.empty(parameter.shape, dtype=parameter.dtype))
                attribute = tensor_at(model, key.attribute)
            attribute.copy_(value.to(attribute.dtype))
        for parameter in parameters.on_meta():
            parameters.replace(parameter, torch.zeros(parameter.shape, dtype=parameter.dtype))
    patterns = [re.compile(p) for p in ignore]
    unexpected = sorted(
        in_file for name, in_file in available.items()
        if name not in used and not any(p.fullmatch(in_file) or p.fullmatch(name) for p in patterns)
    )
    if unexpected:
        shown = ", ".join(repr(n) for n in unexpected[:5])
        raise ResidError(
            f"{where[:1].upper() + where[1:]} has {len(unexpected)} tensor(s) this architecture does not use ({shown}"
            f"{', ...' if len(unexpected) > 5 else ''}). The config.json model_type may be wrong for these weights."
        )


def _same_layout(tensor: Tensor, value: Tensor, parameter: Tensor, attribute: Tensor) -> bool:
    """Whether the checkpoint `tensor` can be `parameter` itself: the same dtype, shape and (contiguous) layout,
    with `value` (the key's view of the tensor) placed in it as `attribute` (its view of the parameter)."""
    if tensor.device.type != "cpu" or tensor.dtype != parameter.dtype:
        return False
    if tensor.shape != parameter.shape or not tensor.is_contiguous() or not parameter.is_contiguous():
        return False
    if value.untyped_storage().data_ptr() != tensor.untyped_storage().data_ptr():
        return False  # the key copied (a rearrangement no view can express)
    return (value.shape == attribute.shape and value.stride() == attribute.stride()
            and value.storage_offset() - tensor.storage_offset()
            == attribute.storage_offset() - parameter.storage_offset())


class _Parameters:
    """The model's parameters by identity, so that one (shared by a tied embedding and unembedding) is replaced
    everywhere it is registered; and the checkpoint memory already in use, so that two parameters read from one
    tensor (Marian's shared embedding) stay two (editing one must not edit the other)."""

    def __init__(self, model: torch.nn.Module):
        self._owners: dict[int, tuple[torch.nn.Parameter, list[tuple[torch.nn.Module, str]]]] = {}
        for module in model.modules():
            for name, parameter in module.named_parameters(recurse=False):
                self._owners.setdefault(id(parameter), (parameter, []))[1].append((module, name))
        self._taken: set[int] = set()

    def takes(self, parameter: Tensor, tensor: Tensor) -> bool:
        """Whether `tensor` can replace `parameter`: it is a registered parameter, and no other took the tensor."""
        return id(parameter) in self._owners and tensor.data_ptr() not in self._taken

    def replace(self, parameter: Tensor, tensor: Tensor) -> None:
        _, places = self._owners.pop(id(parameter))
        new = torch.nn.Parameter(tensor, requires_grad=parameter.requires_grad)
        for module, name in places:
            setattr(module, name, new)
        self._owners[id(new)] = (new, places)
        self._taken.add(tensor.data_ptr())

    def on_meta(self) -> list[torch.nn.Parameter]:
        return [parameter for parameter, _ in self._owners.values() if parameter.is_meta]


def _rearrange(tensor: Tensor, key: Key, sizes: dict[str, int], where: str) -> Tensor:
    if key.rows is not None:
        start, stop, total = key.rows
        if tensor.shape[0] != total:
            raise ResidError(
                f"{where}, the fused tensor {key.checkpoint!r} has {tensor.shape[0]} rows, but this config needs "
                f"{total}. The weights do not match config.json; re-export them."
            )
        tensor = tensor[start:stop]
    if key.order is not None:  # after `rows` (which checked the total), any subset of the rows; else all of them
        if key.rows is None and tensor.shape[0] != len(key.order):
            raise ResidError(
                f"{where}, tensor {key.checkpoint!r} has {tensor.shape[0]} rows, but this config needs "
                f"{len(key.order)}. The weights do not match config.json; re-export them."
            )
        tensor = tensor[torch.tensor(key.order, device=tensor.device)]
    if key.scale != 1.0:
        tensor = tensor * key.scale
    if key.pattern is None:
        value = tensor
    else:
        lhs = key.pattern.split("->")[0]
        lengths = {name: size for name, size in sizes.items() if re.search(rf"\b{name}\b", lhs)}
        try:
            value = einops.rearrange(tensor, key.pattern, **lengths)
        except einops.EinopsError:
            raise ResidError(
                f"{where}, tensor {key.checkpoint!r} has shape {tuple(tensor.shape)}, which does not fit the layout "
                f"'{key.pattern}' with {lengths}. The weights do not match config.json; re-export them."
            ) from None
    return value if key.pick is None else value[key.pick]
