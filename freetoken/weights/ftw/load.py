"""Reading an FTW file's tensors in the background: reader threads bring the file in, a
verifier hashes each piece as soon as it has landed, and callers wait per tensor.

Why the verifier is not the reader: hashing 1.4 GB costs ~0.3 s of one core here (it is
bound by memory bandwidth: the bytes came in by DMA and are not in any cache), and a reader
that hashes its own piece issues no read meanwhile, so fewer reads are in flight and the disk
idles. With the hashing on threads of its own the reads never wait for it; it runs on another
core while the disk works and adds only the hash of the last piece to the load.
Why per-tensor waits: the model is built while the expert banks are still arriving (their
views are handed out at once; the bytes behind a mapped view are the file's whether or not
they are in yet). `finish()` waits for the rest and raises on a checksum mismatch, and the
loader calls it before the model runs, so nothing is computed from an unverified byte."""
from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from ...errors import CheckpointError
from .format import CHUNK_BYTES, TensorEntry, align_up, chunk_digest, combine_digests, dtype_from_name
from .map import map_file
from ...progress import progress

log = logging.getLogger("freetoken.weights")

PIECES_PER_READ = 4          # one read call covers up to 4 hashed pieces (32 MiB): fewer GIL round trips


def _page_buffer(nbytes: int) -> tuple[torch.Tensor, memoryview]:
    """A page-aligned uint8 tensor of `nbytes` rounded up to 4 KiB (O_DIRECT needs aligned
    addresses and lengths); callers view its first nbytes."""
    mm = mmap.mmap(-1, max(align_up(nbytes), 4096))
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


class TensorLoad:
    """Reads `entries` of the FTW file `path` in the background (see the module docstring).
    `tensors`: name -> typed tensor, valid at once for a mapped file, to be read only after
    `wait([name])` otherwise; `wait(names)` blocks until those tensors are read and verified;
    `finish()` until all are (then the threads are gone); `cancel()` stops early."""

    def __init__(self, path: Path, entries: list[TensorEntry], verify: bool = True, threads: int | None = None,
                 direct: bool = True, mapped: bool = True, desc: str | None = None):
        self.path, self.verify = path, verify
        entries = sorted(entries, key=lambda e: e.offset)
        size = path.stat().st_size
        for e in entries:
            if e.offset + e.nbytes > size:
                raise CheckpointError(f"{path}: truncated: tensor {e.name!r} needs bytes {e.offset}..{e.offset + e.nbytes} "
                                      f"but the file has {size}; re-run `freetoken convert`")
        self.mm = map_file(path, size) if mapped and entries else None
        self.mapped = self.mm is not None
        self._reader = None
        if self.mapped:
            raw = {e.name: self.mm.data[e.offset:e.offset + e.nbytes] for e in entries}
        else:
            self._buffers = {e.name: _page_buffer(e.nbytes) for e in entries}
            raw = {e.name: self._buffers[e.name][0][:e.nbytes] for e in entries}
            self._reader = _Reader(path, direct)
        self.tensors = {}
        for e in entries:
            try:
                self.tensors[e.name] = raw[e.name].view(dtype_from_name(e.dtype)).view(e.shape)
            except (ValueError, RuntimeError):
                self.close()
                raise CheckpointError(f"{path}: tensor {e.name!r}: {e.nbytes} bytes do not hold {e.dtype} "
                                      f"{list(e.shape)} (corrupt tensor table)") from None
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._left = {e.name: -(-e.nbytes // CHUNK_BYTES) for e in entries}
        self._digests: dict[str, list[int]] = {e.name: [0] * self._left[e.name] for e in entries}
        self._done = {e.name: threading.Event() for e in entries}
        cores = os.cpu_count() or 1
        threads = threads or min(8, max(4, 2 * cores))
        self._io = ThreadPoolExecutor(threads, thread_name_prefix="ftw-read")
        self._hash = ThreadPoolExecutor(max(1, min(4, cores // 2)), thread_name_prefix="ftw-verify") if verify else None
        self._bar = progress(sum(e.nbytes for e in entries), desc or f"load {path.name}")
        step = CHUNK_BYTES * PIECES_PER_READ
        for e in entries:
            if e.nbytes == 0:                   # no piece: its checksum is that of no digests
                self._left[e.name] = 1
                self._count(e, 1)
            for a in range(0, e.nbytes, step):
                self._io.submit(self._read, e, a, min(step, e.nbytes - a))

    # --- worker side -------------------------------------------------------------------
    def _read(self, e: TensorEntry, a: int, n: int) -> None:
        if self._error is not None:
            return
        try:
            if self.mapped:
                self.mm.populate(e.offset + a, n)
            else:
                view = self._buffers[e.name][1][a:a + align_up(n)]
                if self._reader.read(view, e.offset + a) < n:
                    raise CheckpointError(f"{self.path}: truncated while reading tensor {e.name!r}")
            self._bar.update(n)
            starts = range(a, a + n, CHUNK_BYTES)
            if self._hash is None:
                self._count(e, len(starts))
            else:
                for s in starts:
                    self._hash.submit(self._verify, e, s)
        except BaseException as ex:    # noqa: BLE001 -- handed to the waiting thread
            self._fail(ex)

    def _bytes(self, e: TensorEntry, a: int, n: int) -> memoryview:
        if self.mapped:
            return self.mm.view[e.offset + a:e.offset + a + n]
        return self._buffers[e.name][1][a:a + n]

    def _verify(self, e: TensorEntry, a: int) -> None:
        if self._error is not None:
            return
        try:
            self._digests[e.name][a // CHUNK_BYTES] = chunk_digest(self._bytes(e, a, min(CHUNK_BYTES, e.nbytes - a)))
            self._count(e, 1)
        except BaseException as ex:    # noqa: BLE001
            self._fail(ex)

    def _count(self, e: TensorEntry, k: int) -> None:
        with self._lock:
            self._left[e.name] -= k
            last = self._left[e.name] == 0
        if not last:
            return
        if self.verify and combine_digests(self._digests[e.name]) != e.xxh3:
            self._fail(CheckpointError(f"{self.path}: checksum mismatch in tensor {e.name!r} (file corrupt); "
                                       "re-run `freetoken convert`"))
        self._done[e.name].set()

    def _fail(self, ex: BaseException) -> None:
        with self._lock:
            if self._error is None:
                self._error = ex
        for ev in self._done.values():
            ev.set()

    # --- caller side -------------------------------------------------------------------
    def wait(self, names=None) -> None:
        """Blocks until the tensors `names` (all when None) are read and verified; raises the
        first error seen (checksum mismatch, truncation, I/O)."""
        for name in (self._done if names is None else names):
            self._done[name].wait()
            if self._error is not None:
                raise self._error
        if self._error is not None:
            raise self._error

    def finish(self) -> dict[str, torch.Tensor]:
        """Every tensor read and verified (raises as `wait`); the threads are gone after it."""
        try:
            self.wait()
        finally:
            self.close()
        return self.tensors

    def cancel(self) -> None:
        """Stops the reads still queued (a failed model build) and releases the threads."""
        self._fail(CheckpointError(f"{self.path}: load cancelled"))
        self.close()

    def close(self) -> None:
        for pool in (getattr(self, "_io", None), getattr(self, "_hash", None)):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        if getattr(self, "_bar", None) is not None:
            self._bar.close()
            self._bar = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
