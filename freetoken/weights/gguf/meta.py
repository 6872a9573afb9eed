"""The GGUF container: metadata key-values and the tensor table, parsed over a read-only
memory map with the `gguf` package's format constants. (The package's GGUFReader builds one
numpy view per vocabulary string, ~45 s for a 150k-token vocabulary; this reads the header
of a real model in well under a second and maps the tensor data without copying.)"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import CheckpointError
from ..validate import check_gguf_alignment


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]      # numpy order (rows last-but-one, columns last), as torch sees it
    ggml_type: int
    offset: int                 # absolute byte offset in the file
    nbytes: int


@dataclass
class GgufHeader:
    path: Path
    fields: dict
    tensors: dict[str, TensorInfo]
    buf: object                 # the memory map (kept open while tensors are viewed)

    def raw(self, t: TensorInfo) -> np.ndarray:
        """The tensor's bytes, u8 [..., rows, row_bytes], viewed in the map (no copy; the pages
        it touches stay resident while mapped: loaders read with `GgufFile.raw` instead)."""
        arr = np.frombuffer(self.buf, dtype=np.uint8, count=t.nbytes, offset=t.offset)
        return arr.reshape(byte_shape(t))


def byte_shape(t: TensorInfo) -> tuple[int, ...]:
    """u8 shape [..., rows, row_bytes] of tensor `t`'s bytes."""
    import gguf
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(t.ggml_type)]
    return (*t.shape[:-1], t.shape[-1] // block * size)


def read_header(path: str | Path, tensors: bool = True, keys: str = "", string_arrays: bool = True) -> GgufHeader:
    """Metadata (only keys starting with `keys`, all by default) and, if asked, the tensor table.
    `string_arrays=False` skips every array of strings (the vocabulary and merges: 300k strings
    of a 150k-token vocabulary, most of the header's parse time; only the tokenizer needs them)."""
    import gguf
    T = gguf.GGUFValueType
    scalars = {T.UINT8: "<B", T.INT8: "<b", T.UINT16: "<H", T.INT16: "<h", T.UINT32: "<I", T.INT32: "<i",
               T.FLOAT32: "<f", T.BOOL: "<?", T.UINT64: "<Q", T.INT64: "<q", T.FLOAT64: "<d"}
    u64 = struct.Struct("<Q").unpack_from
    path = Path(path)
    try:
        with open(path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, buf, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def string():
        nonlocal pos
        n = take("<Q")
        pos += n
        return buf[pos - n:pos].decode("utf-8", errors="replace")

    def skip_or_value(vt, keep):
        nonlocal pos
        if vt == T.STRING:
            return string()
        if vt != T.ARRAY:
            return take(scalars[T(vt)])
        et, n = take("<I"), take("<Q")
        if et == T.STRING:
            keep = keep and string_arrays
            out, p = [], pos               # one tight loop: a vocabulary is 150k+ strings
            for _ in range(n):
                k = u64(buf, p)[0]
                p += 8 + k
                if keep:
                    out.append(str(buf[p - k:p], "utf-8", "replace"))
            pos = p
            return out if keep else None
        if et == T.ARRAY:
            return [skip_or_value(T.ARRAY, keep) for _ in range(n)]
        dt = np.dtype(scalars[T(et)])
        arr = np.frombuffer(buf, dtype=dt, count=n, offset=pos) if keep else None
        pos += n * dt.itemsize
        return arr.tolist() if keep else None

    try:
        if take("<I") != gguf.GGUF_MAGIC:
            raise ValueError("bad magic (not a GGUF file)")
        version = take("<I")
        if version < 2:
            raise ValueError(f"GGUF version {version} is too old (expected 2 or later)")
        n_tensors, n_kv = take("<Q"), take("<Q")
        fields = {}
        for _ in range(n_kv):
            key = string()
            keep = key.startswith(keys) or key in ("general.alignment", "general.architecture")
            v = skip_or_value(take("<I"), keep)
            if keep:
                fields[key] = v
        infos = {}
        if tensors:
            raw = []
            for _ in range(n_tensors):
                name = string()
                dims = [take("<Q") for _ in range(take("<I"))]
                raw.append((name, tuple(reversed(dims)), take("<I"), take("<Q")))
            align = check_gguf_alignment(path, fields.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT))
            start = -(-pos // align) * align
            infos = _tensor_infos(raw, start, len(buf))
    except (ValueError, struct.error, KeyError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not a readable GGUF file ({e})") from None
    return GgufHeader(path, fields, infos, buf)


def _tensor_infos(raw: list, start: int, file_bytes: int) -> dict[str, TensorInfo]:
    """The tensor table's (name, shape, type, offset) rows checked against the types' blocks and
    the file's size (ValueError: the caller names the file)."""
    import gguf
    infos = {}
    for name, shape, ty, off in raw:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ty)]
        if shape[-1] % block:
            raise ValueError(f"tensor {name!r}: {shape[-1]} columns, not a multiple of the "
                             f"{gguf.GGMLQuantizationType(ty).name} block ({block})")
        nbytes = int(np.prod(shape[:-1], dtype=np.int64)) * (shape[-1] // block) * size
        if start + off + nbytes > file_bytes:
            raise ValueError(f"truncated: tensor {name!r} ends at byte {start + off + nbytes}, "
                             f"the file has {file_bytes}")
        infos[name] = TensorInfo(name, shape, ty, start + off, nbytes)
    return infos
