"""Dequantize GGUF tensors to float32 with vectorized torch code.

Glossary:
    block      the unit of a ggml type: `block_size` values stored in `type_size` bytes (gguf.GGML_QUANT_SIZES).
    d, m       per-block f16 scale and (for the "_1" and K types) minimum: value = d * q + m (Q4_1, Q5_1) or
               (d * scale) * q - dmin * min (Q4_K, Q5_K).
    q          the small unsigned integer codes; "_0" types and Q6_K centre them (q - 8, q - 16, q - 32).
    sub-block  K types (256 values per super-block) split a block into 8 x 32 (Q4_K, Q5_K) or 16 x 16 (Q6_K)
               values, each with its own 6- or 8-bit scale multiplied into the f16 super-block scale.

The block layouts are ggml's (ggml-common.h); gguf.quants holds a numpy reference implementation, which the
tests use as the oracle. Each dequantizer performs the same float32 operations in the same order (multiply,
then add), never a fused multiply-add, so results equal the reference bit for bit.

Why not gguf.quants.dequantize: it takes ~1.5 s for SmolLM2-135M, half the cold-load budget of resid.
"""

from collections.abc import Callable

import gguf
import numpy as np
import torch
from jaxtyping import Float, UInt8
from torch import Tensor

from resid.errors import ResidError
from resid.load.gguf_format import GGUFTensor

QT = gguf.GGMLQuantizationType

_SHIFTS_8 = torch.arange(8, dtype=torch.uint8).view(8, 1)
_SHIFTS_Q6 = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 4, 1)


def _f16(blocks: Tensor, start: int, count: int = 1) -> Tensor:
    """The `count` f16s stored from byte `start` of every block, as float32 of shape (n_blocks, count)."""
    return blocks[:, start : start + 2 * count].contiguous().view(torch.float16).float()


def _nibbles(qs: Tensor) -> Tensor:
    """Low nibbles of a run of bytes, then their high nibbles: ggml's order for 4-bit codes."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def _bits(qh: Tensor) -> Tensor:
    """(n, width) bytes -> (n, 8, width) with [:, i, j] = bit i of byte j."""
    return (qh.unsqueeze(-2) >> _SHIFTS_8) & 1


# Integer codes times a float32 scale promote to float32 inside the one multiply (exactly, as the codes are
# small integers): one pass over the data instead of a conversion pass and then a multiply pass.


def _q8_0(blocks: Tensor) -> Tensor:
    return blocks[:, 2:].view(torch.int8) * _f16(blocks, 0)


def _q4_0(blocks: Tensor) -> Tensor:
    return _nibbles(blocks[:, 2:]).view(torch.int8).sub_(8) * _f16(blocks, 0)


def _q4_1(blocks: Tensor) -> Tensor:
    d_m = _f16(blocks, 0, count=2)
    return (_nibbles(blocks[:, 4:]) * d_m[:, 0:1]).add_(d_m[:, 1:2])


# _FIFTH_BITS[b, i] = (bit i of byte b) << 4: the 5th bits of eight values from one byte of qh, by table lookup
# (one gather instead of eight shift-and-mask passes over every block).
_FIFTH_BITS = (((torch.arange(256).view(256, 1) >> torch.arange(8)) & 1) << 4).to(torch.uint8)


def _q5_codes(qh: Tensor, qs: Tensor) -> Tensor:
    # qh is one little-endian u32 whose bit j is the 5th bit of value j: byte j // 8, bit j % 8.
    return _nibbles(qs) | _FIFTH_BITS[qh.long()].view(qh.shape[0], 32)


def _q5_0(blocks: Tensor) -> Tensor:
    return _q5_codes(blocks[:, 2:6], blocks[:, 6:]).view(torch.int8).sub_(16) * _f16(blocks, 0)


def _q5_1(blocks: Tensor) -> Tensor:
    d_m = _f16(blocks, 0, count=2)
    return (_q5_codes(blocks[:, 4:8], blocks[:, 8:]) * d_m[:, 0:1]).add_(d_m[:, 1:2])


def _k_scales(scales: Tensor) -> tuple[Tensor, Tensor]:
    """Unpack Q4_K/Q5_K's 12 bytes into 8 six-bit scales and 8 six-bit mins.

    Bytes 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7 mins 0-3; scales/mins 4-7 take their low
    4 bits from bytes 8-11 (low/high nibble) and their top 2 bits from the spare top bits of bytes 0-7.
    """
    lo_sc, lo_min, packed = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat([lo_sc & 0x3F, (packed & 0x0F) | ((lo_sc >> 2) & 0x30)], dim=-1)
    mn = torch.cat([lo_min & 0x3F, (packed >> 4) | ((lo_min >> 2) & 0x30)], dim=-1)
    return sc, mn


def _k_nibbles(qs: Tensor) -> Tensor:
    """Q4_K/Q5_K codes as (n, 8, 32): each 32-byte run gives one sub-block of low, one of high nibbles."""
    qs = qs.reshape(qs.shape[0], 4, 1, 32)
    return torch.cat([qs & 0x0F, qs >> 4], dim=2).reshape(qs.shape[0], 8, 32)


def _k_affine(blocks: Tensor, q: Tensor) -> Tensor:
    sc, mn = _k_scales(blocks[:, 4:16])
    d_dmin = _f16(blocks, 0, count=2)
    scale = (d_dmin[:, 0:1] * sc).unsqueeze(-1)
    offset = (d_dmin[:, 1:2] * mn).unsqueeze(-1)
    return (q * scale).sub_(offset).reshape(blocks.shape[0], 256)


def _q4_k(blocks: Tensor) -> Tensor:
    return _k_affine(blocks, _k_nibbles(blocks[:, 16:144]))


def _q5_k(blocks: Tensor) -> Tensor:
    # qh's 32 bytes: bit i of byte j is the 5th bit of value j of sub-block i.
    high = _bits(blocks[:, 16:48])
    return _k_affine(blocks, _k_nibbles(blocks[:, 48:176]) | (high << 4))


def _q6_k(blocks: Tensor) -> Tensor:
    n = blocks.shape[0]
    # Two halves of 128 values: ql gives low nibbles then high nibbles of 64 bytes; qh gives 2-bit pairs.
    ql = blocks[:, 0:128].reshape(n, 2, 1, 64)
    ql = torch.cat([ql & 0x0F, ql >> 4], dim=2).reshape(n, 8, 32)
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32)
    qh = ((qh >> _SHIFTS_Q6) & 0x03).reshape(n, 8, 32)
    scale = (_f16(blocks, 208) * blocks[:, 192:208].view(torch.int8).float()).unsqueeze(-1)
    return ((ql | (qh << 4)).view(torch.int8).sub_(32).view(n, 16, 16) * scale).view(n, 256)


def _f32(blocks: Tensor) -> Tensor:
    # A copy, so the weights own their memory and editing them never writes into the mapped file's pages.
    return blocks.view(torch.float32).clone()


def _f16_values(blocks: Tensor) -> Tensor:
    return blocks.view(torch.float16).float()


def _bf16(blocks: Tensor) -> Tensor:
    # bf16 is the top half of an f32, so this conversion is exact.
    return blocks.view(torch.bfloat16).float()


_DEQUANTIZERS: dict[QT, Callable[[Tensor], Tensor]] = {
    QT.F32: _f32,
    QT.F16: _f16_values,
    QT.BF16: _bf16,
    QT.Q8_0: _q8_0,
    QT.Q4_0: _q4_0,
    QT.Q4_1: _q4_1,
    QT.Q5_0: _q5_0,
    QT.Q5_1: _q5_1,
    QT.Q4_K: _q4_k,
    QT.Q5_K: _q5_k,
    QT.Q6_K: _q6_k,
}

SUPPORTED_TYPES: tuple[QT, ...] = tuple(_DEQUANTIZERS)


def _check_supported(qtype: QT) -> None:
    if qtype not in _DEQUANTIZERS:
        names = ", ".join(t.name for t in SUPPORTED_TYPES)
        raise ResidError(
            f"resid cannot dequantize ggml type {qtype.name}; supported types are {names}. Re-export the "
            "model with one of them (e.g. llama.cpp's llama-quantize to Q8_0 or Q4_K_M)."
        )


def dequantize_blocks(raw: UInt8[Tensor, " n_bytes"], qtype: QT) -> Float[Tensor, "n_blocks block_size"]:
    """Dequantize raw ggml blocks of one type; the byte count must be a whole number of blocks."""
    _check_supported(qtype)
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    if raw.numel() % type_size != 0:
        raise ResidError(
            f"{raw.numel()} bytes is not a whole number of {qtype.name} blocks ({type_size} bytes each); the "
            "tensor data is corrupt."
        )
    return _DEQUANTIZERS[qtype](raw.view(-1, type_size)).view(-1, block_size)


def dequantize(tensor: GGUFTensor) -> Float[Tensor, "..."]:
    """The tensor's values as a new float32 torch tensor of shape `tensor.shape`."""
    _check_supported(tensor.qtype)
    block_size, type_size = gguf.GGML_QUANT_SIZES[tensor.qtype]
    n_values = int(np.prod(tensor.shape, dtype=np.int64))
    expected = n_values // block_size * type_size
    if n_values % block_size != 0 or tensor.data.nbytes != expected:
        raise ResidError(
            f"Tensor {tensor.name!r} of type {tensor.qtype.name} and shape {tensor.shape} needs {expected} "
            f"bytes but has {tensor.data.nbytes}; read it with resid.load.gguf_format.read_gguf."
        )
    raw = torch.from_numpy(np.ascontiguousarray(tensor.data).view(np.uint8).reshape(-1))
    return dequantize_blocks(raw, tensor.qtype).reshape(tensor.shape)
