"""A fast reader for GGUF v2/v3 files: header, metadata and zero-copy views of the tensor bytes.

Glossary:
    ne       ggml's dimension order, fastest-varying first; `GGUFTensor.shape` is ne reversed (numpy order),
             so token_embd.weight of SmolLM2-135M is (49152, 576) = (d_vocab, d_model).
    block    the unit of a quantized type: `block_size` values stored in `type_size` bytes
             (gguf.GGML_QUANT_SIZES); a row of ne0 values is ne0 / block_size blocks.
    data     the tensor data section, starting at the first multiple of `general.alignment` after the
             tensor infos; each tensor's offset is relative to it.

Layout (all little-endian): magic "GGUF", u32 version, u64 tensor_count, u64 kv_count, then kv_count
(string key, u32 value type, value) entries, then tensor_count (string name, u32 n_dims, u64 ne[n_dims],
u32 ggml type, u64 offset) infos. A string is a u64 byte length then UTF-8 bytes; an array is a u32 item
type, a u64 count, then the items.

Why not gguf.GGUFReader: it builds a numpy view per metadata item (~98k for a 49k-token vocabulary) and
takes ~2 s to open SmolLM2-135M; this reader decodes the string arrays in one pass over bytes (~0.05 s).
The gguf package stays the oracle in tests and the source of the type constants.
"""

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from resid.errors import ResidError

_MAGIC = b"GGUF"
_SUPPORTED_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# Fixed-size scalar value types: (struct format, numpy dtype for arrays of them).
_SCALARS: dict[int, tuple[struct.Struct, str]] = {
    gguf.GGUFValueType.UINT8: (struct.Struct("<B"), "<u1"),
    gguf.GGUFValueType.INT8: (struct.Struct("<b"), "<i1"),
    gguf.GGUFValueType.UINT16: (struct.Struct("<H"), "<u2"),
    gguf.GGUFValueType.INT16: (struct.Struct("<h"), "<i2"),
    gguf.GGUFValueType.UINT32: (struct.Struct("<I"), "<u4"),
    gguf.GGUFValueType.INT32: (struct.Struct("<i"), "<i4"),
    gguf.GGUFValueType.FLOAT32: (struct.Struct("<f"), "<f4"),
    gguf.GGUFValueType.UINT64: (struct.Struct("<Q"), "<u8"),
    gguf.GGUFValueType.INT64: (struct.Struct("<q"), "<i8"),
    gguf.GGUFValueType.FLOAT64: (struct.Struct("<d"), "<f8"),
    # Read as a byte and compared with 0 below: a bool stored as 2 must still mean True.
    gguf.GGUFValueType.BOOL: (struct.Struct("<B"), "<u1"),
}


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file: its name, ggml type, numpy-order shape and raw bytes."""

    name: str
    qtype: gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    # A uint8 view into the file's copy-on-write mapping: no bytes are read until used, and writes to it
    # (there should be none) could never reach the file on disk.
    data: np.ndarray


@dataclass(frozen=True)
class GGUFFile:
    """A parsed GGUF file: metadata values as Python objects and its tensors by name, in file order."""

    path: Path
    version: int
    metadata: dict[str, object]
    tensors: dict[str, GGUFTensor]


class _Reader:
    """A cursor over the mapped file that turns every out-of-bounds read into a ResidError."""

    def __init__(self, path: Path, buf: mmap.mmap) -> None:
        self.path = path
        self.buf = buf
        self.size = len(buf)
        self.pos = 0

    def fail(self, problem: str) -> ResidError:
        return ResidError(f"Cannot read GGUF file {self.path}: {problem}")

    def need(self, n_bytes: int, what: str) -> None:
        if self.pos + n_bytes > self.size:
            raise self.fail(
                f"truncated: reading {what} needs {n_bytes} bytes at offset {self.pos} but the file has "
                f"{self.size} bytes; re-download or re-export the file."
            )

    def u32(self, what: str) -> int:
        self.need(4, what)
        (value,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return value

    def u64(self, what: str) -> int:
        self.need(8, what)
        (value,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return value

    def string(self, what: str) -> str:
        length = self.u64(what)
        self.need(length, what)
        raw = self.buf[self.pos : self.pos + length]
        self.pos += length
        return self._decode(raw, what)

    def _decode(self, raw: bytes, what: str) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} is not valid UTF-8 ({exc.reason}); the file is corrupt.") from None

    def value(self, value_type: int, what: str) -> object:
        if value_type == gguf.GGUFValueType.STRING:
            return self.string(what)
        if value_type == gguf.GGUFValueType.ARRAY:
            return self.array(what)
        if value_type not in _SCALARS:
            raise self._unknown_type(value_type, what)
        fmt, _ = _SCALARS[value_type]
        self.need(fmt.size, what)
        (value,) = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return value != 0 if value_type == gguf.GGUFValueType.BOOL else value

    def array(self, what: str) -> list:
        item_type = self.u32(what)
        count = self.u64(what)
        if item_type == gguf.GGUFValueType.STRING:
            return self.string_array(count, what)
        if item_type in _SCALARS:
            _, dtype = _SCALARS[item_type]
            n_bytes = count * np.dtype(dtype).itemsize
            self.need(n_bytes, what)
            items = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
            self.pos += n_bytes
            return (items != 0).tolist() if item_type == gguf.GGUFValueType.BOOL else items.tolist()
        if item_type == gguf.GGUFValueType.ARRAY:
            return [self.array(what) for _ in range(count)]
        raise self._unknown_type(item_type, what)

    def string_array(self, count: int, what: str) -> list[str]:
        # The hot loop of the whole reader (vocabularies and merges): plain locals, one bounds check per item.
        buf, pos, size = self.buf, self.pos, self.size
        unpack, out = _U64.unpack_from, []
        append = out.append
        for _ in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.need(8, what)
            (length,) = unpack(buf, pos)
            end = pos + 8 + length
            if end > size:
                self.pos = pos + 8
                self.need(length, what)
            try:
                append(buf[pos + 8 : end].decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise self.fail(f"{what} holds a string that is not valid UTF-8 ({exc.reason}).") from None
            pos = end
        self.pos = pos
        return out

    def _unknown_type(self, value_type: int, what: str) -> ResidError:
        known = ", ".join(f"{t.value}={t.name}" for t in gguf.GGUFValueType)
        return self.fail(
            f"{what} has unknown metadata value type {value_type} (known: {known}); the file is corrupt or "
            "was written by a newer GGUF version than resid understands."
        )


def _open(path: Path) -> mmap.mmap:
    try:
        with open(path, "rb") as f:
            if f.seek(0, 2) < len(_MAGIC):
                raise ResidError(
                    f"Cannot read GGUF file {path}: not a GGUF file (it has only {f.tell()} bytes, fewer than "
                    "the 4-byte magic); re-download or re-export the file."
                )
            # ACCESS_COPY (a private mapping) gives numpy/torch writable views without copying, while no
            # write can ever reach the file on disk.
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except OSError as exc:
        raise ResidError(f"Cannot read GGUF file {path}: {exc.strerror or exc}. Check the path.") from None


def _read_header(r: _Reader) -> tuple[int, int, int]:
    magic = r.buf[:4]
    if magic != _MAGIC:
        raise r.fail(
            f"not a GGUF file (magic {magic!r}, expected {_MAGIC!r}). Pass a .gguf file written by llama.cpp "
            "or the gguf Python package."
        )
    r.pos = 4
    version = r.u32("the header (version)")
    if version & 0xFFFF == 0 and version != 0:
        raise r.fail(
            "this is a big-endian GGUF file, which resid does not support; convert it to little-endian "
            "(gguf-py's gguf_convert_endian.py)."
        )
    if version not in _SUPPORTED_VERSIONS:
        raise r.fail(
            f"unsupported GGUF version {version} (resid reads versions {_SUPPORTED_VERSIONS}); re-export the "
            "file with a current llama.cpp or gguf package."
        )
    n_tensors = r.u64("the header (tensor count)")
    n_kv = r.u64("the header (metadata count)")
    return version, n_tensors, n_kv


def _read_metadata(r: _Reader, n_kv: int) -> dict[str, object]:
    metadata: dict[str, object] = {}
    for i in range(n_kv):
        key = r.string(f"metadata key #{i}")
        value_type = r.u32(f"metadata {key!r}")
        if key in metadata:
            raise r.fail(f"metadata key {key!r} appears twice; the file is corrupt.")
        metadata[key] = r.value(value_type, f"metadata {key!r}")
    return metadata


def _read_tensor_infos(r: _Reader, n_tensors: int) -> list[tuple[str, int, tuple[int, ...], int]]:
    infos = []
    for i in range(n_tensors):
        name = r.string(f"tensor info #{i}")
        n_dims = r.u32(f"tensor info {name!r}")
        r.need(8 * n_dims, f"tensor info {name!r}")
        ne = np.frombuffer(r.buf, dtype="<u8", count=n_dims, offset=r.pos).tolist()
        r.pos += 8 * n_dims
        raw_type = r.u32(f"tensor info {name!r}")
        offset = r.u64(f"tensor info {name!r}")
        infos.append((name, raw_type, tuple(reversed(ne)), offset))
    return infos


def _tensor_nbytes(r: _Reader, name: str, qtype: gguf.GGMLQuantizationType, shape: tuple[int, ...]) -> int:
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    n_values = int(np.prod(shape, dtype=np.uint64)) if shape else 1
    if shape and shape[-1] % block_size != 0:
        raise r.fail(
            f"tensor {name!r} has rows of {shape[-1]} values, not a multiple of the {qtype.name} block size "
            f"{block_size}; the file is corrupt."
        )
    return n_values // block_size * type_size


def _make_tensors(r: _Reader, infos: list, data_start: int) -> dict[str, GGUFTensor]:
    whole = np.frombuffer(r.buf, dtype=np.uint8)
    tensors: dict[str, GGUFTensor] = {}
    for name, raw_type, shape, offset in infos:
        try:
            qtype = gguf.GGMLQuantizationType(raw_type)
        except ValueError:
            raise r.fail(
                f"tensor {name!r} has unknown quantization type {raw_type}; the file was written by a newer "
                "llama.cpp than the installed gguf package knows; upgrade the gguf package."
            ) from None
        n_bytes = _tensor_nbytes(r, name, qtype, shape)
        start = data_start + offset
        if start + n_bytes > r.size:
            raise r.fail(
                f"truncated: header says tensor {name!r} needs {n_bytes} bytes at offset {start} but the file "
                f"has {r.size} bytes; re-download or re-export the file."
            )
        if name in tensors:
            raise r.fail(f"tensor {name!r} appears twice; the file is corrupt.")
        tensors[name] = GGUFTensor(name=name, qtype=qtype, shape=shape, data=whole[start : start + n_bytes])
    return tensors


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse a GGUF v2/v3 file; tensor bytes stay in the memory-mapped file until dequantized.

    Raises ResidError naming the file for a wrong magic, an unsupported version, a truncated file, or an
    unknown metadata value type or quantization type.
    """
    path = Path(path)
    r = _Reader(path, _open(path))
    version, n_tensors, n_kv = _read_header(r)
    metadata = _read_metadata(r, n_kv)
    infos = _read_tensor_infos(r, n_tensors)
    alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0:
        raise r.fail(f"general.alignment is {alignment!r}; it must be a positive integer.")
    data_start = -(-r.pos // alignment) * alignment
    return GGUFFile(path=path, version=version, metadata=metadata, tensors=_make_tensors(r, infos, data_start))
