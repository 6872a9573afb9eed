"""Writing FTW files (format in weights/ftw/format.py): the tensor table laid out and checksummed, the
bytes streamed in chunks; `RecordingCheckpoint` notes what a model build reads, so that
`freetoken convert` (loading/convert.py) writes exactly that; the side files kept beside the
weights. A GGUF source is streamed as it is (weights/ftw/from_gguf.py)."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

from ...errors import CheckpointError
from ..checkpoint import Checkpoint
from .format import (ALIGN, CHUNK_BYTES, TensorEntry, align_up, chunk_digest, combine_digests, dtype_name,
                         encode_preamble_and_header, header_reserve)
from ...progress import progress
from ..gguf.side import side_file

SIDE_FILE_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".tiktoken", ".vocab")
SIDE_FILE_MAX = 64 << 20
_SKIP_FILES = {"config.json", "model.safetensors.index.json"}


class RecordingCheckpoint:
    """A Checkpoint that notes every tensor name read or found present, outside the expert
    section (whose tensors end up inside the pool)."""

    def __init__(self, ck: Checkpoint):
        self._ck, self.config, self.dir = ck, ck.config, ck.dir
        self.dense: dict[str, None] = {}          # ordered set
        self._section = None

    def _note(self, name):
        if self._section is None:
            self.dense.setdefault(name)

    def has(self, name):
        found = self._ck.has(name)
        if found:
            self._note(name)
        return found

    def get(self, name, shape=None):
        t = self._ck.get(name, shape)         # models may probe names that are absent
        self._note(name)
        return t

    def get_float(self, name, shape=None, dtype=torch.float32):
        t = self._ck.get_float(name, shape, dtype)
        self._note(name)
        return t

    def names(self):
        return self._ck.names()

    def prebuilt_experts(self):
        return self._ck.prebuilt_experts()     # a GGUF's packed ggml experts; None for HF directories

    @contextlib.contextmanager
    def reading(self, section: str):
        self._section = section
        try:
            yield
        finally:
            self._section = None

    def close(self):
        pass


def default_dtype(config: dict) -> str:
    cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    dt = str(cfg.get("dtype") or cfg.get("torch_dtype") or config.get("torch_dtype") or "bfloat16")
    return dt if dt in ("float32", "bfloat16", "float16") else "bfloat16"


def side_files(model_dir: Path) -> list[tuple[str, bytes]]:
    """(name, contents) of the files beside the weights: a directory's tokenizer/config files, or
    those a GGUF's metadata stands for (tokenizer.json, tokenizer_config.json, generation_config.json)."""
    if model_dir.is_file():
        texts = ((n, side_file(model_dir, n)) for n in ("tokenizer.json", "tokenizer_config.json",
                                                         "generation_config.json"))
        return [(n, t.encode()) for n, t in texts if t is not None]
    return [(p.name, p.read_bytes()) for p in sorted(model_dir.iterdir())
            if p.is_file() and not p.name.startswith(".") and p.name not in _SKIP_FILES
            and p.suffix in SIDE_FILE_SUFFIXES and p.stat().st_size <= SIDE_FILE_MAX]


def _as_bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())


def write_tensors(out: Path, header: dict, items: list[tuple[str, str, torch.Tensor]]) -> None:
    """`items` (name, kind, tensor) into the FTW file `out` under `header`, whose "tensors" this fills."""
    entries = _layout(header, [(name, kind, dtype_name(t.dtype), tuple(t.shape), t.numel() * t.element_size())
                               for name, kind, t in items])
    write_ftw(out, header, entries, [(lambda t=t: _pieces(_as_bytes(t))) for _, _, t in items])


def _pieces(data: memoryview):
    for a in range(0, len(data), CHUNK_BYTES):
        yield data[a:a + CHUNK_BYTES]


def write_ftw(out: Path, header: dict, entries: list[TensorEntry], sources) -> None:
    """Writes the FTW file `out` (through `out.partial`, renamed when complete): tensor i's bytes
    are the pieces `sources[i]()` yields (CHUNK_BYTES each but the last: one checksum per piece),
    at `entries[i].offset`; `header["tensors"]` gets the entries with their checksums. The
    written pages are flushed and dropped from the page cache every GiB (a 17 GB convert
    would otherwise leave the machine's memory full of dirty pages)."""
    tmp = out.with_name(out.name + ".partial")
    total = sum(e.nbytes for e in entries)
    flushed = 0
    try:
        with open(tmp, "wb") as f, progress(total, f"convert -> {out.name}") as bar:
            for i, (entry, source) in enumerate(zip(entries, sources)):
                f.seek(entry.offset)
                digests, n = [], 0
                for piece in source():
                    if len(piece) != min(CHUNK_BYTES, entry.nbytes - n):
                        raise CheckpointError(f"{out}: internal error: tensor {entry.name!r} piece of {len(piece)} bytes")
                    f.write(piece)
                    digests.append(chunk_digest(piece))
                    n += len(piece)
                    bar.update(len(piece))
                if n != entry.nbytes:
                    raise CheckpointError(f"{out}: internal error: tensor {entry.name!r} got {n} of {entry.nbytes} bytes")
                f.write(b"\0" * (align_up(entry.nbytes) - entry.nbytes))
                entries[i] = TensorEntry(**{**entry.__dict__, "xxh3": combine_digests(digests)})
                if f.tell() - flushed >= 1 << 30 and hasattr(os, "posix_fadvise"):
                    f.flush()
                    os.fdatasync(f.fileno())
                    os.posix_fadvise(f.fileno(), flushed, f.tell() - flushed, os.POSIX_FADV_DONTNEED)
                    flushed = f.tell()
            header["tensors"] = [e.to_json() for e in entries]
            head = encode_preamble_and_header(header)
            if len(head) > (entries[0].offset if entries else ALIGN):
                raise CheckpointError(f"{out}: internal error: header grew past its reserved space")
            f.seek(0)
            f.write(head)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def _layout(header: dict, items, extra=None) -> list[TensorEntry]:
    """Offsets for every tensor (name, kind, dtype name, shape, nbytes) after a header big enough
    to hold the final table; `extra[i]`: more TensorEntry fields of tensor i (ggml type, dims)."""
    reserve = ALIGN
    while True:
        entries, off = [], reserve
        for i, (name, kind, dtype, shape, nbytes) in enumerate(items):
            entries.append(TensorEntry(name, kind, dtype, shape, off, nbytes, "0" * 16, **(extra[i] if extra else {})))
            off += align_up(nbytes)
        need = header_reserve({**header, "tensors": [e.to_json() for e in entries]})
        if need <= reserve:
            return entries
        reserve = need
