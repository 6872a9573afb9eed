"""The FTW file mapped copy-on-write, its pages brought in by several threads.

Why not read into new memory: every load must otherwise fault in and zero fresh anonymous
pages, which on VMs costs about as much as the disk read itself (docs/benchmarks.md). A
private mapping of the file uses the page-cache pages the reads fill, so the bytes land
once and are never zeroed or copied; `MADV_POPULATE_READ` (Linux 5.14+) reads a range in
without a fault per page and, called from several threads, keeps several reads in flight.
Writes to the mapping stay private (copy-on-write), so the file is never changed."""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
from pathlib import Path

import torch

MADV_POPULATE_READ = 22
_PAGE = mmap.PAGESIZE

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.madvise.restype = ctypes.c_int


class MappedFile:
    """The whole file as one uint8 tensor over a MAP_PRIVATE mapping; tensor views of it keep
    the mapping alive. `populate(offset, n)` reads a range in (the GIL is released)."""

    def __init__(self, path: Path, size: int):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            self._mm = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.data = torch.frombuffer(self._mm, dtype=torch.uint8)
        self.view = memoryview(self._mm)
        self._base = self.data.data_ptr()

    def populate(self, offset: int, n: int) -> None:
        start = offset - offset % _PAGE
        if _libc.madvise(self._base + start, n + offset - start, MADV_POPULATE_READ):
            e = ctypes.get_errno()
            raise OSError(e, f"madvise(MADV_POPULATE_READ): {os.strerror(e)}")


def map_file(path: Path, size: int) -> MappedFile | None:
    """The mapped file, or None where mapping or MADV_POPULATE_READ is not available (old
    kernel, a file system without mmap): the caller then reads into its own buffers."""
    try:
        m = MappedFile(path, size)
        m.populate(0, min(size, _PAGE))
        return m
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.ENOSYS, errno.ENODEV, errno.EACCES, errno.EPERM, errno.ENOTSUP):
            return None
        raise
