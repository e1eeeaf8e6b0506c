"""Our torch dequantizers against gguf.quants.dequantize (numpy, the oracle) on the same bytes: data the gguf
package quantizes itself, random raw blocks (every bit pattern, valid f16 scales), and all of SmolLM2."""

import gguf
import numpy as np
import pytest
import torch

from resid.errors import ResidError
from resid.load.gguf_format import GGUFFile, GGUFTensor
from resid.load.gguf_quants import SUPPORTED_TYPES, dequantize

QT = gguf.GGMLQuantizationType

# Types gguf.quants.quantize can produce; the K types have only a numpy dequantizer there.
QUANTIZABLE = [QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1]
FLOAT_TYPES = {QT.F32, QT.F16, QT.BF16}

# Byte offsets of the f16 scales/mins inside one block; the remaining bytes are codes, any value is valid.
F16_FIELDS = {
    QT.Q8_0: [0],
    QT.Q4_0: [0],
    QT.Q4_1: [0, 2],
    QT.Q5_0: [0],
    QT.Q5_1: [0, 2],
    QT.Q4_K: [0, 2],
    QT.Q5_K: [0, 2],
    QT.Q6_K: [208],
}


def _oracle(raw: np.ndarray, qtype: QT, shape: tuple[int, ...]) -> np.ndarray:
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    if qtype == QT.F32:
        return raw.view(np.float32).reshape(shape)
    if qtype == QT.F16:
        return gguf.quants.dequantize(raw.view(np.float16), qtype).reshape(shape)
    return gguf.quants.dequantize(raw.reshape(-1, type_size), qtype).reshape(shape)


def _assert_matches_oracle(raw: np.ndarray, qtype: QT, shape: tuple[int, ...]) -> None:
    ours = dequantize(GGUFTensor(name="t", qtype=qtype, shape=shape, data=raw))
    expected = torch.from_numpy(np.array(_oracle(raw, qtype, shape), dtype=np.float32))
    assert ours.dtype == torch.float32 and ours.shape == shape
    if qtype in FLOAT_TYPES:
        torch.testing.assert_close(ours, expected, rtol=0, atol=0, equal_nan=True)
    else:
        torch.testing.assert_close(ours, expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=lambda t: t.name)
def test_matches_gguf_on_quantized_data(qtype: QT) -> None:
    values = np.random.default_rng(int(qtype)).standard_normal((6, 512)).astype(np.float32)
    quantized = np.ascontiguousarray(gguf.quants.quantize(values, qtype))
    _assert_matches_oracle(quantized.view(np.uint8).reshape(-1), qtype, (6, 512))


@pytest.mark.parametrize("qtype", list(F16_FIELDS), ids=lambda t: t.name)
def test_matches_gguf_on_random_blocks(qtype: QT) -> None:
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    shape = (3, 4, 2 * 256)
    n_blocks = int(np.prod(shape)) // block_size
    rng = np.random.default_rng(int(qtype) + 100)
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for at in F16_FIELDS[qtype]:
        scales = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
        blocks[:, at : at + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    _assert_matches_oracle(blocks.reshape(-1), qtype, shape)


@pytest.mark.parametrize("qtype", sorted(FLOAT_TYPES), ids=lambda t: t.name)
def test_float_types_on_every_bit_pattern(qtype: QT) -> None:
    # Random bytes include infinities, NaNs, subnormals and -0.0.
    raw = np.random.default_rng(7).integers(0, 256, size=4 * 4096, dtype=np.uint8)
    n_values = raw.size // gguf.GGML_QUANT_SIZES[qtype][1]
    _assert_matches_oracle(raw, qtype, (n_values // 64, 64))


def test_covers_the_required_types() -> None:
    required = {QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q4_K, QT.Q5_K, QT.Q6_K}
    assert required <= set(SUPPORTED_TYPES)


def test_f32_result_owns_its_memory() -> None:
    raw = np.arange(8, dtype=np.float32).view(np.uint8)
    out = dequantize(GGUFTensor(name="t", qtype=QT.F32, shape=(2, 4), data=raw))
    out.zero_()
    assert raw.view(np.float32).tolist() == list(range(8))


def test_unsupported_type_lists_supported_ones() -> None:
    _, type_size = gguf.GGML_QUANT_SIZES[QT.IQ2_XXS]
    raw = np.zeros(type_size, dtype=np.uint8)
    with pytest.raises(ResidError, match=r"cannot dequantize ggml type IQ2_XXS; supported types are .*Q4_K"):
        dequantize(GGUFTensor(name="t", qtype=QT.IQ2_XXS, shape=(256,), data=raw))


def test_wrong_byte_count() -> None:
    raw = np.zeros(33, dtype=np.uint8)
    with pytest.raises(ResidError, match=r"'w' of type Q8_0 and shape \(32,\) needs 34 bytes but has 33"):
        dequantize(GGUFTensor(name="w", qtype=QT.Q8_0, shape=(32,), data=raw))


def test_smollm2_every_tensor_matches_gguf(smollm2_gguf: GGUFFile) -> None:
    for tensor in smollm2_gguf.tensors.values():
        ours = dequantize(tensor)
        expected = torch.from_numpy(_oracle(tensor.data, tensor.qtype, tensor.shape))
        # torch.equal first: assert_close's diagnostics cost seconds over 135M values; we are bit-exact anyway.
        if not torch.equal(ours, expected):
            torch.testing.assert_close(ours, expected, rtol=1e-6, atol=0, msg=lambda m: f"{tensor.name}: {m}")
    embed = dequantize(smollm2_gguf.tensors["token_embd.weight"])
    assert embed.shape == (49152, 576) and embed.dtype == torch.float32
