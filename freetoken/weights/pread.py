"""Reading file ranges straight into their final buffers: `pread` in large pieces, the page
cache dropped behind the reader (`posix_fadvise(DONTNEED)`), so a load holds each byte once
(a memory map would keep every page it touched resident in the process until unmapped,
doubling the load peak)."""
from __future__ import annotations

import os

import numpy as np
import torch

PIECE = 64 << 20          # bytes per read call: large enough for the disk, small enough to drop behind


class RangeReader:
    """Reads ranges of one file into caller buffers; `on_bytes(n)` after each piece (progress)."""

    def __init__(self, path, on_bytes=None):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        self.on_bytes = on_bytes

    def into(self, dst: memoryview, offset: int) -> None:
        """Fills the writable contiguous buffer `dst` (bytes) from file offset `offset`."""
        dst = dst.cast("B") if dst.format != "B" or dst.ndim != 1 else dst
        done, n = 0, len(dst)
        while done < n:
            k = os.preadv(self.fd, [dst[done:min(n, done + PIECE)]], offset + done)
            if k == 0:
                raise EOFError(f"{self.path}: truncated: needs bytes {offset}..{offset + n}, read {done}")
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(self.fd, offset + done, k, os.POSIX_FADV_DONTNEED)
            done += k
            if self.on_bytes is not None:
                self.on_bytes(k)

    def array(self, offset: int, nbytes: int) -> np.ndarray:
        """A new u8 array of the range."""
        out = np.empty(nbytes, dtype=np.uint8)
        if nbytes:
            self.into(memoryview(out), offset)
        return out

    def tensor_into(self, dst: torch.Tensor, offset: int) -> None:
        """Fills a contiguous CPU tensor from the file (its bytes as stored)."""
        if not dst.is_contiguous():
            raise ValueError("tensor_into needs a contiguous destination")
        if dst.numel():
            self.into(memoryview(dst.reshape(-1).view(torch.uint8).numpy()), offset)   # reshape first: a 0-dim scalar cannot be viewed as bytes

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
