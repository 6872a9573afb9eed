"""A GGUF kept in an FTW file: `convert` streams every GGUF tensor into the FTW file as the GGUF
has it (kind "ggml": same bytes, type and shape, under its GGUF name, 4 KiB-aligned, a checksum
per 8 MiB piece), with the tokenizer side files and the HF config the GGUF's metadata stands
for. Nothing is built or dequantized, so the convert holds one piece buffer (8 MiB) and the
FTW file is the GGUF's size plus alignment and side files.

Loading it is loading the GGUF: `GgufInFtw` is a `GgufFile` whose tensor table points into
the FTW file, so the same code reads the same bytes (dense rows kept packed, experts into
their banks, the disk tier's layout) and the logits are the GGUF's bit for bit. What the FTW
file adds: the checksums (verified as each tensor is read in order), the config and tokenizer
inside one file, aligned offsets."""
from __future__ import annotations

import bisect
import threading
from pathlib import Path

import numpy as np
import xxhash

from ...errors import CheckpointError
from .format import CHUNK_BYTES, VERSION, TensorEntry, combine_digests, config_hash
from .writer import _layout, side_files, write_ftw
from ..gguf.reader import GgufFile
from ..gguf.meta import GgufHeader, TensorInfo, byte_shape
from ..pread import RangeReader
from .reader import read_header


def convert_gguf(src: Path, out: Path, expert_format: str | None = None) -> dict:
    """Writes the FTW file `out` from the GGUF `src` (all parts of a split one); returns its header."""
    ck = GgufFile(src)
    if expert_format:
        raise CheckpointError(f"{src}: a GGUF converts with its tensors as they are; pass --expert-format "
                              f"{expert_format} to `freetoken serve` instead (float experts are re-encoded at load)")
    files = [(n, np.frombuffer(d, dtype=np.uint8)) for n, d in side_files(src)]
    tensors = sorted(ck.tensors_by_name.values(), key=lambda ht: (str(ht[0].path), ht[1].offset))
    items = [(n, "file", "uint8", (len(d),), len(d)) for n, d in files]
    items += [(t.name, "ggml", "uint8", byte_shape(t), t.nbytes) for _, t in tensors]
    extra = [{}] * len(files) + [{"ggml_type": t.ggml_type, "dims": tuple(t.shape)} for _, t in tensors]
    header = {"format_version": VERSION, "config": ck.config, "config_hash": config_hash(ck.config),
              "source": src.resolve().name, "options": {"dtype": None, "expert_format": None},
              "experts": None, "gguf": {"arch": ck.arch, "parts": len(ck.headers)},
              "chunk_bytes": CHUNK_BYTES, "tensors": []}
    entries = _layout(header, items, extra)
    readers = {h.path: RangeReader(h.path) for h in ck.headers}
    buf = np.empty(CHUNK_BYTES, dtype=np.uint8)       # the one piece buffer the convert holds

    def stream(h: GgufHeader, t: TensorInfo):
        for a in range(0, t.nbytes, CHUNK_BYTES):
            n = min(CHUNK_BYTES, t.nbytes - a)
            readers[h.path].into(memoryview(buf[:n]), t.offset + a)
            yield memoryview(buf[:n])

    sources = [(lambda d=d: iter([memoryview(d)] if len(d) else [])) for _, d in files]
    sources += [(lambda h=h, t=t: stream(h, t)) for h, t in tensors]
    try:
        write_ftw(out, header, entries, sources)
    finally:
        for r in readers.values():
            r.close()
        ck.close()
    return header


def is_gguf_ftw(header: dict) -> bool:
    return bool(header.get("gguf"))


class _Checksums:
    """Verifies the tensors of an FTW file as they are read: reads of one tensor that come in
    file order (the loaders read whole tensors, or expert after expert) are hashed piece by
    piece like the writer did; a tensor read out of order (the disk tier's single experts) is
    left to later whole reads."""

    def __init__(self, path: Path, entries: list[TensorEntry]):
        self.path = path
        self._entries = sorted(entries, key=lambda e: e.offset)
        self._starts = [e.offset for e in self._entries]
        self._state: dict[str, tuple[int, object, list[int]]] = {}
        self._lock = threading.Lock()

    def feed(self, offset: int, data: memoryview) -> None:
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0:
            return
        e = self._entries[i]
        if offset + len(data) > e.offset + e.nbytes:
            return                              # not inside one tensor: not a tensor read
        with self._lock:
            pos, h, digests = self._state.get(e.name, (0, None, []))
            if offset == e.offset:              # a (new) read from the start
                pos, h, digests = 0, xxhash.xxh3_64(), []
            elif h is None or offset != e.offset + pos:
                self._state.pop(e.name, None)   # out of order: not verified by this pass
                return
            while len(data):
                take = CHUNK_BYTES - pos % CHUNK_BYTES
                h.update(data[:take])
                pos += min(take, len(data))
                data = data[take:]
                if pos % CHUNK_BYTES == 0 or pos == e.nbytes:
                    digests.append(h.intdigest())
                    h.reset()
            if pos < e.nbytes:
                self._state[e.name] = (pos, h, digests)
                return
            self._state.pop(e.name, None)
        if combine_digests(digests) != e.xxh3:
            raise CheckpointError(f"{self.path}: checksum mismatch in tensor {e.name!r} (file corrupt); "
                                  "re-run `freetoken convert`")


class _VerifyingReader(RangeReader):
    def __init__(self, path, on_bytes, checks: _Checksums | None):
        super().__init__(path, on_bytes)
        self._checks = checks

    def into(self, dst: memoryview, offset: int) -> None:
        dst = dst.cast("B") if dst.format != "B" or dst.ndim != 1 else dst
        super().into(dst, offset)
        if self._checks is not None:
            self._checks.feed(offset, dst)


class GgufInFtw(GgufFile):
    """The GGUF tensors of an FTW file (see the module docstring) as a GgufFile."""

    def __init__(self, path, cfg=None, header: dict | None = None, verify: bool = True):
        header = header if header is not None else read_header(Path(path))
        self.header = header
        size = Path(path).stat().st_size
        entries = [TensorEntry.from_json(t) for t in header["tensors"]]
        infos = {}
        for e in entries:
            if e.kind != "ggml":
                continue
            if e.ggml_type is None or e.dims is None:
                raise CheckpointError(f"{path}: tensor {e.name!r}: kind ggml without ggml_type/dims (corrupt tensor table)")
            if e.offset + e.nbytes > size:
                raise CheckpointError(f"{path}: truncated: tensor {e.name!r} needs bytes {e.offset}..{e.offset + e.nbytes} "
                                      f"but the file has {size}; re-run `freetoken convert`")
            infos[e.name] = TensorInfo(e.name, e.dims, e.ggml_type, e.offset, e.nbytes)
        self._checks = _Checksums(Path(path), [e for e in entries if e.kind == "ggml"]) if verify else None
        self._setup(path, [GgufHeader(Path(path), {}, infos, None)], header["gguf"].get("arch"),
                    lambda: header["config"], cfg)

    def _open_reader(self, path: Path, on_bytes):
        return _VerifyingReader(path, on_bytes, self._checks)

    def abandon(self):
        self.close()
