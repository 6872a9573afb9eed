"""Reading an FTW file (format in ftw_format.py) at disk speed.

Every tensor is read once, by several threads, in CHUNK_BYTES pieces, and each piece is
hashed as soon as it lands. By default the file is mapped copy-on-write and the threads
bring its pages in (ftw_map.py: no fresh memory to fault in and zero, no copy); else each
tensor is read into its own page-aligned, exactly-sized buffer (O_DIRECT when the file
system allows it, else ordinary reads). Expert banks come back as
an ExpertPool in their runtime layout; the other tensors answer the Checkpoint interface,
so models load from an FTW file exactly as from an HF directory."""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from ..errors import CheckpointError
from .ftw_format import (CHUNK_BYTES, MAGIC, PREAMBLE, VERSION, TensorEntry, align_up, chunk_digest,
                         combine_digests, config_hash, dtype_from_name)
from .ftw_map import map_file
from .progress import progress

log = logging.getLogger("freetoken.weights")


def is_ftw(path: str | os.PathLike) -> bool:
    p = Path(path)
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC


def read_header(path: Path) -> dict:
    """The validated header: magic, format version, header checksum, config hash."""
    with open(path, "rb") as f:
        pre = f.read(PREAMBLE.size)
        if len(pre) < PREAMBLE.size or pre[:len(MAGIC)] != MAGIC:
            raise CheckpointError(f"{path}: not an FTW file (expected magic {MAGIC!r} at byte 0)")
        _, version, _, size, digest = PREAMBLE.unpack(pre)
        if version != VERSION:
            raise CheckpointError(f"{path}: FTW format version {version}, this FreeToken reads version "
                                  f"{VERSION}; re-run `freetoken convert`")
        body = f.read(size)
    if len(body) < size:
        raise CheckpointError(f"{path}: truncated inside the header ({len(body)} of {size} bytes)")
    from xxhash import xxh3_64_intdigest
    if xxh3_64_intdigest(body) != digest:
        raise CheckpointError(f"{path}: header checksum mismatch (the tensor table is corrupt)")
    header = json.loads(body)
    if config_hash(header["config"]) != header["config_hash"]:
        raise CheckpointError(f"{path}: config hash mismatch (config.json inside the file was altered)")
    return header


def _page_buffer(nbytes: int) -> tuple[torch.Tensor, memoryview]:
    """A page-aligned uint8 tensor of `nbytes` rounded up to 4 KiB (O_DIRECT needs aligned
    addresses and lengths); callers view its first nbytes."""
    size = max(align_up(nbytes), 4096)
    mm = mmap.mmap(-1, size)
    return torch.frombuffer(mm, dtype=torch.uint8), memoryview(mm)


class _Reader:
    """pread into memory, O_DIRECT first; falls back to buffered reads on the first refusal."""

    def __init__(self, path: Path, direct: bool):
        self.fd = os.open(path, os.O_RDONLY)
        self.direct_fd = None
        if direct and hasattr(os, "O_DIRECT"):
            try:
                self.direct_fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            except OSError:
                log.info("%s: O_DIRECT refused by the file system; using buffered reads", path)

    @property
    def direct(self) -> bool:
        return self.direct_fd is not None

    def read(self, buf: memoryview, offset: int) -> int:
        done = 0
        while done < len(buf):
            fd = self.direct_fd if self.direct_fd is not None else self.fd
            try:
                n = os.preadv(fd, [buf[done:]], offset + done)
            except OSError as e:
                if e.errno != errno.EINVAL or fd == self.fd:
                    raise
                self.direct_fd = None               # alignment refused at read time: go buffered
                continue
            if n == 0:
                break
            done += n
        return done

    def close(self):
        for fd in (self.fd, self.direct_fd):
            if fd is not None:
                os.close(fd)


def read_tensors(path: Path, entries: list[TensorEntry], verify: bool = True, threads: int | None = None,
                 direct: bool = True, desc: str | None = None, mapped: bool = True) -> dict[str, torch.Tensor]:
    """name -> tensor for `entries`, read in parallel; checksums verified while reading.
    `mapped`: the tensors are views of a copy-on-write mapping of the file (ftw_map.py), else
    (or where mapping is not available) they are read into buffers of their own, with
    O_DIRECT when `direct` and the file system allow it."""
    size = path.stat().st_size
    for e in sorted(entries, key=lambda e: e.offset):
        if e.offset + e.nbytes > size:
            raise CheckpointError(f"{path}: truncated: tensor {e.name!r} needs bytes {e.offset}..{e.offset + e.nbytes} "
                                  f"but the file has {size}; re-run `freetoken convert`")
    threads = threads or min(8, max(4, 2 * (os.cpu_count() or 1)))
    jobs = [(e, a) for e in sorted(entries, key=lambda e: e.offset) for a in range(0, e.nbytes, CHUNK_BYTES)]
    mm = map_file(path, size) if mapped and entries else None
    if mm is not None:
        def work(e: TensorEntry, a: int) -> int:
            n = min(CHUNK_BYTES, e.nbytes - a)
            mm.populate(e.offset + a, n)
            bar.update(n)
            return chunk_digest(mm.view[e.offset + a:e.offset + a + n]) if verify else 0

        def tensor(e: TensorEntry) -> torch.Tensor:
            return mm.data[e.offset:e.offset + e.nbytes]
        reader = None
    else:
        buffers = {e.name: _page_buffer(e.nbytes) for e in entries}
        reader = _Reader(path, direct)

        def work(e: TensorEntry, a: int) -> int:
            n = min(CHUNK_BYTES, e.nbytes - a)
            view = buffers[e.name][1][a:a + align_up(n)]
            if reader.read(view, e.offset + a) < n:
                raise CheckpointError(f"{path}: truncated while reading tensor {e.name!r}")
            bar.update(n)
            return chunk_digest(view[:n]) if verify else 0

        def tensor(e: TensorEntry) -> torch.Tensor:
            return buffers[e.name][0][:e.nbytes]
    try:
        with progress(sum(e.nbytes for e in entries), desc or f"load {path.name}") as bar, \
                ThreadPoolExecutor(threads, thread_name_prefix="ftw-read") as pool:
            digests = list(pool.map(lambda j: work(*j), jobs))
    finally:
        if reader is not None:
            reader.close()
    if verify:
        per: dict[str, list[int]] = {e.name: [] for e in entries}
        for (e, _), d in zip(jobs, digests):
            per[e.name].append(d)
        for e in sorted(entries, key=lambda e: e.offset):
            if combine_digests(per[e.name]) != e.xxh3:
                raise CheckpointError(f"{path}: checksum mismatch in tensor {e.name!r} (file corrupt); "
                                      "re-run `freetoken convert`")
    out = {}
    for e in entries:
        try:
            out[e.name] = tensor(e).view(dtype_from_name(e.dtype)).view(e.shape)
        except (ValueError, RuntimeError):
            raise CheckpointError(f"{path}: tensor {e.name!r}: {e.nbytes} bytes do not hold {e.dtype} "
                                  f"{list(e.shape)} (corrupt tensor table)") from None
    return out


class FtwFile:
    """An FTW file seen as a checkpoint (config, has/get/get_float) plus its prebuilt pool."""

    def __init__(self, path: str | os.PathLike, verify: bool = True, threads: int | None = None,
                 direct: bool = True, mapped: bool = True):
        self.path = self.dir = Path(path)
        header = read_header(self.path)
        self.header, self.config = header, header["config"]
        try:
            self.entries = [TensorEntry.from_json(t) for t in header["tensors"]]
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{self.path}: malformed tensor table ({e})") from None
        self.direct = direct
        self.float_experts_dtype: torch.dtype | None = None    # set by open_checkpoint from the engine options
        self._tensors = read_tensors(self.path, self.entries, verify, threads, direct, mapped=mapped)
        self._dense = {e.name for e in self.entries if e.kind == "dense"}

    @property
    def options(self) -> dict:
        return self.header.get("options") or {}

    def names(self) -> list[str]:
        return sorted(self._dense)

    def has(self, name: str) -> bool:
        return name in self._dense

    def get(self, name: str, shape: tuple | None = None) -> torch.Tensor:
        if name not in self._dense:
            raise CheckpointError(f"{self.path}: tensor {name!r} not found in the FTW file")
        t = self._tensors[name]
        if shape is not None and not (len(shape) == t.dim() and all(s is None or s == d for s, d in zip(shape, t.shape))):
            raise CheckpointError(f"{self.path}: tensor {name!r} has shape {tuple(t.shape)}, expected {shape}")
        return t

    def get_float(self, name: str, shape=None, dtype=torch.float32) -> torch.Tensor:
        t = self.get(name, shape)
        if not t.is_floating_point():
            raise CheckpointError(f"{self.path}: tensor {name!r} has dtype {t.dtype}, expected a float type")
        return t.to(dtype)

    def file_bytes(self, name: str) -> bytes | None:
        t = self._tensors.get(name)
        return bytes(t.numpy()) if t is not None and name not in self._dense else None

    def prebuilt_experts(self):
        from ..experts.pool import ExpertPool, ExpertSpec
        ex = self.header.get("experts")
        if not ex:
            return None
        banks = {e.name: self._tensors[e.name] for e in self.entries if e.kind == "bank"}
        spec = ExpertSpec(**ex["spec"])
        want = self.float_experts_dtype
        if spec.fmt == "float" and want is not None and banks["gate_up"].dtype != want:
            log.warning("%s: experts stored as %s, converting to %s at load (convert with --dtype to skip this)",
                        self.path, banks["gate_up"].dtype, want)
            banks = {k: v if k.endswith("_bias") else v.to(want) for k, v in banks.items()}
        return ExpertPool(banks, ex["num_layers"], ex["num_experts"], spec)

    def reading(self, section: str):
        return contextlib.nullcontext()

    def close(self):
        self._tensors = {k: v for k, v in self._tensors.items() if k not in self._dense}


def read_side_file(path: str | os.PathLike, name: str) -> bytes | None:
    """One side file (tokenizer.json, ...) of an FTW file, verified, without reading the rest."""
    path = Path(path)
    entry = next((TensorEntry.from_json(t) for t in read_header(path)["tensors"]
                  if t["name"] == name and t["kind"] == "file"), None)
    if entry is None:
        return None
    return bytes(read_tensors(path, [entry], threads=1, direct=False, desc=f"read {name}", mapped=False)[name].numpy())
