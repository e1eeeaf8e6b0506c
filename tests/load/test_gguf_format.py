"""read_gguf against gguf.GGUFReader (the oracle) on SmolLM2 and on small files written by gguf.GGUFWriter,
plus every kind of malformed file, whose error must name the file and say what is wrong."""

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from resid.errors import ResidError
from resid.load.gguf_format import GGUFFile, read_gguf

QT = gguf.GGMLQuantizationType
VT = gguf.GGUFValueType

# Fields GGUFReader synthesizes from the header; they are not metadata key/value pairs in the file.
_READER_HEADER_FIELDS = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}


def _reader_metadata(reader: gguf.GGUFReader) -> dict[str, object]:
    return {k: f.contents() for k, f in reader.fields.items() if k not in _READER_HEADER_FIELDS}


def test_smollm2_metadata_equals_gguf_reader(smollm2_gguf: GGUFFile, smollm2_reader: gguf.GGUFReader) -> None:
    assert smollm2_gguf.version == 3
    assert smollm2_gguf.metadata == _reader_metadata(smollm2_reader)
    tokens = smollm2_gguf.metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, list) and len(tokens) == 49152 and tokens[:2] == ["<|endoftext|>", "<|im_start|>"]
    assert smollm2_gguf.metadata["tokenizer.ggml.add_bos_token"] is False


def test_smollm2_tensors_equal_gguf_reader(smollm2_gguf: GGUFFile, smollm2_reader: gguf.GGUFReader) -> None:
    assert list(smollm2_gguf.tensors) == [t.name for t in smollm2_reader.tensors]
    for ref in smollm2_reader.tensors:
        ours = smollm2_gguf.tensors[ref.name]
        assert ours.name == ref.name
        assert ours.qtype == ref.tensor_type
        assert ours.shape == tuple(int(n) for n in reversed(ref.shape)), ref.name
        assert ours.data.dtype == np.uint8 and ours.data.ndim == 1
        assert np.array_equal(ours.data, ref.data.view(np.uint8).reshape(-1)), ref.name


def test_smollm2_summary(smollm2_gguf: GGUFFile) -> None:
    counts: dict[QT, int] = {}
    for tensor in smollm2_gguf.tensors.values():
        counts[tensor.qtype] = counts.get(tensor.qtype, 0) + 1
    assert counts == {QT.Q4_1: 210, QT.Q8_0: 1, QT.F32: 61}
    embed = smollm2_gguf.tensors["token_embd.weight"]
    assert embed.qtype == QT.Q8_0 and embed.shape == (49152, 576)


def _metadata_fixture() -> list[tuple[str, object, VT, VT | None]]:
    """(key, value, type, array item type) for every GGUF value type, including arrays and nested arrays."""
    return [
        ("test.u8", 200, VT.UINT8, None),
        ("test.i8", -100, VT.INT8, None),
        ("test.u16", 60000, VT.UINT16, None),
        ("test.i16", -30000, VT.INT16, None),
        ("test.u32", 4_000_000_000, VT.UINT32, None),
        ("test.i32", -2_000_000_000, VT.INT32, None),
        ("test.f32", 0.15625, VT.FLOAT32, None),
        ("test.bool_true", True, VT.BOOL, None),
        ("test.bool_false", False, VT.BOOL, None),
        ("test.str", "héllo wörld ✓ 中文", VT.STRING, None),
        ("test.empty_str", "", VT.STRING, None),
        ("test.u64", 2**63 + 5, VT.UINT64, None),
        ("test.i64", -(2**62), VT.INT64, None),
        ("test.f64", 1.0 / 3.0, VT.FLOAT64, None),
        ("test.arr_i32", [1, -2, 3], VT.ARRAY, VT.INT32),
        ("test.arr_u8", [0, 255, 7], VT.ARRAY, VT.UINT8),
        ("test.arr_f32", [0.5, -1.25, 3.0], VT.ARRAY, VT.FLOAT32),
        ("test.arr_bool", [True, False, True], VT.ARRAY, VT.BOOL),
        ("test.arr_str", ["a", "", "Ġthe", "日本"], VT.ARRAY, VT.STRING),
        ("test.arr_nested", [[1, 2], [3]], VT.ARRAY, VT.ARRAY),
    ]


def _tensor_fixture() -> dict[str, tuple[np.ndarray, QT | None, tuple[int, ...]]]:
    """name -> (array to write, raw ggml type or None for a plain float array, numpy-order shape)."""
    rng = np.random.default_rng(0)
    q8 = gguf.quants.quantize(rng.standard_normal((3, 64)).astype(np.float32), QT.Q8_0)
    q4 = gguf.quants.quantize(rng.standard_normal((2, 32)).astype(np.float32), QT.Q4_1)
    return {
        "blk.0.f32": (rng.standard_normal((4, 5)).astype(np.float32), None, (4, 5)),
        "blk.0.f16_3d": (rng.standard_normal((2, 3, 4)).astype(np.float16), None, (2, 3, 4)),
        "blk.0.vector": (rng.standard_normal(7).astype(np.float32), None, (7,)),
        "blk.0.q8_0": (q8, QT.Q8_0, (3, 64)),
        "blk.0.q4_1": (q4, QT.Q4_1, (2, 32)),
    }


def _write_gguf(path: Path, alignment: int | None = None) -> Path:
    writer = gguf.GGUFWriter(path, arch="testarch")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    for key, value, vtype, sub_type in _metadata_fixture():
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    for name, (array, raw_dtype, _) in _tensor_fixture().items():
        writer.add_tensor(name, array, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("alignment", [None, 64, 8])
def test_writer_file_reads_back(tmp_path: Path, alignment: int | None) -> None:
    path = _write_gguf(tmp_path / "small.gguf", alignment)
    ours = read_gguf(path)
    assert ours.path == path and ours.version == 3
    for key, value, _, _ in _metadata_fixture():
        assert ours.metadata[key] == value, key
        assert type(ours.metadata[key]) is type(value), key
    assert ours.metadata["general.architecture"] == "testarch"
    oracle = _reader_metadata(gguf.GGUFReader(path))
    assert {k: v for k, v in ours.metadata.items() if k != "test.arr_nested"} == {
        k: v for k, v in oracle.items() if k != "test.arr_nested"
    }
    expected = _tensor_fixture()
    assert list(ours.tensors) == list(expected)
    for name, (array, raw_dtype, shape) in expected.items():
        tensor = ours.tensors[name]
        assert tensor.shape == shape, name
        assert tensor.qtype == (raw_dtype or (QT.F16 if array.dtype == np.float16 else QT.F32)), name
        assert np.array_equal(tensor.data, array.view(np.uint8).reshape(-1)), name


def _error(path: Path) -> str:
    with pytest.raises(ResidError) as info:
        read_gguf(path)
    message = str(info.value)
    assert path.name in message, message
    return message


def _tensor_info_start(data: bytes) -> int:
    return data.index(b"blk.0.f32") - 8  # the u64 length before the first tensor name


def test_wrong_magic(tmp_path: Path) -> None:
    good = _write_gguf(tmp_path / "good.gguf").read_bytes()
    bad = tmp_path / "model.bin"
    bad.write_bytes(b"GGML" + good[4:])
    assert "not a GGUF file" in _error(bad)
    tiny = tmp_path / "tiny.gguf"
    tiny.write_bytes(b"GG")
    assert "not a GGUF file" in _error(tiny)


def test_missing_file(tmp_path: Path) -> None:
    assert "No such file" in _error(tmp_path / "absent.gguf")


@pytest.mark.parametrize("where", ["header", "metadata key", "metadata string array", "tensor infos", "data"])
def test_truncated(tmp_path: Path, where: str) -> None:
    good = _write_gguf(tmp_path / "good.gguf").read_bytes()
    cut = {
        "header": 13,
        "metadata key": good.index(b"general.architecture") + 5,
        "metadata string array": good.index("Ġthe".encode()) + 2,
        "tensor infos": _tensor_info_start(good) + 12,
        # One byte short of the last tensor's data (the file ends in alignment padding after it).
        "data": good.index(last_data := _tensor_fixture()["blk.0.q4_1"][0].tobytes()) + len(last_data) - 1,
    }[where]
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(good[:cut])
    message = _error(bad)
    assert "truncated" in message and "re-download" in message, message
    if where == "data":
        assert "blk.0.q4_1" in message and f"has {cut} bytes" in message, message


def test_truncated_at_data_start_names_first_tensor(tmp_path: Path) -> None:
    good = _write_gguf(tmp_path / "good.gguf").read_bytes()
    data_start = good.index(read_gguf(tmp_path / "good.gguf").tensors["blk.0.f32"].data.tobytes())
    assert data_start % 32 == 0
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(good[:data_start])
    assert "tensor 'blk.0.f32' needs 80 bytes" in _error(bad)


@pytest.mark.parametrize("version", [1, 4, 99])
def test_unsupported_version(tmp_path: Path, version: int) -> None:
    good = _write_gguf(tmp_path / "good.gguf").read_bytes()
    bad = tmp_path / "v.gguf"
    bad.write_bytes(good[:4] + struct.pack("<I", version) + good[8:])
    assert f"unsupported GGUF version {version}" in _error(bad)


def test_big_endian_is_refused(tmp_path: Path) -> None:
    good = _write_gguf(tmp_path / "good.gguf").read_bytes()
    bad = tmp_path / "be.gguf"
    bad.write_bytes(good[:4] + struct.pack(">I", 3) + good[8:])
    assert "big-endian" in _error(bad)


def test_unknown_value_type(tmp_path: Path) -> None:
    good = bytearray(_write_gguf(tmp_path / "good.gguf").read_bytes())
    key = b"test.u8"
    type_at = good.index(key) + len(key)
    assert struct.unpack_from("<I", good, type_at)[0] == VT.UINT8
    struct.pack_into("<I", good, type_at, 13)
    bad = tmp_path / "vt.gguf"
    bad.write_bytes(bytes(good))
    message = _error(bad)
    assert "unknown metadata value type 13" in message and "test.u8" in message, message


def test_unknown_quantization_type(tmp_path: Path) -> None:
    good = bytearray(_write_gguf(tmp_path / "good.gguf").read_bytes())
    name = b"blk.0.f32"
    type_at = good.index(name) + len(name) + 4 + 2 * 8  # n_dims, then two u64 dims
    assert struct.unpack_from("<I", good, type_at)[0] == QT.F32
    struct.pack_into("<I", good, type_at, 250)
    bad = tmp_path / "qt.gguf"
    bad.write_bytes(bytes(good))
    message = _error(bad)
    assert "unknown quantization type 250" in message and "blk.0.f32" in message, message


def test_data_views_do_not_copy(smollm2_gguf: GGUFFile) -> None:
    tensors = list(smollm2_gguf.tensors.values())
    assert all(not t.data.flags.owndata and t.data.base is tensors[0].data.base for t in tensors)
