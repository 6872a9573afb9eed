"""One bank of the host expert cache's slots, in memory a resize really gives back.

A bank is an anonymous mapping of its own (not the malloc heap, where a freed block may stay
in the process): pages cost memory only once a read touches them, and a shrink returns the
tail's pages to the OS at once (`madvise(DONTNEED)`, the mapping stays for a later grow).
Rows keep their slot's place except where a resize compacts the survivors to the front;
a grow past the mapping maps a larger one and copies the survivors (the old one is unmapped
when the last tensor over it goes).
"""
from __future__ import annotations

import mmap

import numpy as np
import torch


class HostRows:
    def __init__(self, slots: int, row_shape: tuple[int, ...], dtype: torch.dtype):
        self.row_shape, self.dtype = tuple(row_shape), dtype
        self.row_nbytes = int(np.prod(row_shape, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()
        self._map(slots)

    def _map(self, slots: int) -> None:
        # private: a shared anonymous map is shmem, where DONTNEED keeps the pages and THP is off
        self._mm = mmap.mmap(-1, max(1, slots * self.row_nbytes), flags=mmap.MAP_PRIVATE)
        if hasattr(mmap, "MADV_HUGEPAGE"):      # 2 MiB pages: fewer TLB misses as the kernels stream rows
            try:
                self._mm.madvise(mmap.MADV_HUGEPAGE)
            except OSError:                     # (THP unsupported here: 4 KiB pages)
                pass
        self.bank = self._view(slots)

    def _view(self, slots: int) -> torch.Tensor:
        raw = torch.frombuffer(self._mm, dtype=torch.uint8, count=slots * self.row_nbytes)
        return raw.view(self.dtype).view(slots, *self.row_shape)

    @property
    def mapped_nbytes(self) -> int:
        return len(self._mm)

    def resize(self, keep: np.ndarray, slots: int) -> torch.Tensor:
        """The bank for `slots` slots whose rows 0..len(keep)-1 are the old rows `keep`
        (ascending, so each row moves down or stays: in place without a temporary)."""
        keep = np.asarray(keep, np.int64)
        if len(keep) > 1 and (np.diff(keep) <= 0).any():
            raise ValueError("host rows: the kept slots must ascend")
        old = self.bank
        if slots * self.row_nbytes > len(self._mm):        # grow past the mapping: a new one
            self._map(slots)
            if len(keep):
                torch.index_select(old, 0, torch.from_numpy(keep), out=self.bank[:len(keep)])
            return self.bank
        for new, src in enumerate(keep.tolist()):
            if new != src:
                old[new].copy_(old[src])
        free_from = -(-slots * self.row_nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
        if free_from < len(self._mm):                      # the tail's pages go back to the OS now
            self._mm.madvise(mmap.MADV_DONTNEED, free_from, len(self._mm) - free_from)
        self.bank = self._view(slots)
        return self.bank
