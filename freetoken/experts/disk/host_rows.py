"""One bank of the host expert cache's slots, in memory a resize really gives back.

A bank is an anonymous mapping of its own (not the malloc heap, where a freed block may stay
in the process): pages cost memory only once a read touches them, and a shrink returns the
tail's pages to the OS at once (`madvise(DONTNEED)`, the mapping stays for a later grow).
Rows keep their slot's place except where a resize compacts the survivors to the front;
a grow past the mapping maps a larger one and copies the survivors (the old one is unmapped
when the last tensor over it goes).

Frames for O_DIRECT (direct.py): slot s owns the bytes [s*stride, (s+1)*stride) of the
mapping, its row starting `lead` bytes in. With `lead` = a piece's file offset modulo the
disk's alignment and `stride` a multiple of it, the piece's aligned span is read straight into
the frame (the span's head lands in the lead, its tail in the frame's end): no bounce copy.
The kernels take the bank's slot stride as it is (`stride(0)`), rows stay contiguous.
"""
from __future__ import annotations

import mmap

import numpy as np
import torch


class HostRows:
    def __init__(self, slots: int, row_shape: tuple[int, ...], dtype: torch.dtype, lead: int = 0,
                 stride: int | None = None):
        self.row_shape, self.dtype = tuple(row_shape), dtype
        self.esize = torch.empty(0, dtype=dtype).element_size()
        self.row_nbytes = int(np.prod(row_shape, dtype=np.int64)) * self.esize
        self.lead, self.stride = int(lead), self.row_nbytes if stride is None else int(stride)
        if self.lead % self.esize or self.stride % self.esize or self.lead + self.row_nbytes > self.stride:
            raise ValueError(f"host rows: lead {lead} and stride {stride} do not frame {self.row_nbytes}-byte rows "
                             f"of {dtype}")
        self._map(slots)

    def _map(self, slots: int) -> None:
        # private: a shared anonymous map is shmem, where DONTNEED keeps the pages and THP is off
        self._mm = mmap.mmap(-1, max(1, slots * self.stride), flags=mmap.MAP_PRIVATE)
        if hasattr(mmap, "MADV_HUGEPAGE"):      # 2 MiB pages: fewer TLB misses as the kernels stream rows
            try:
                self._mm.madvise(mmap.MADV_HUGEPAGE)
            except OSError:                     # (THP unsupported here: 4 KiB pages)
                pass
        self.bank = self._view(slots)

    def _view(self, slots: int) -> torch.Tensor:
        raw = torch.frombuffer(self._mm, dtype=torch.uint8, count=max(1, slots * self.stride))
        if self.stride == self.row_nbytes and not self.lead:
            return raw[:slots * self.stride].view(self.dtype).view(slots, *self.row_shape)
        inner = torch.empty(self.row_shape, dtype=self.dtype, device="meta").stride()
        return raw.view(self.dtype).as_strided((slots, *self.row_shape), (self.stride // self.esize, *inner),
                                               self.lead // self.esize)

    def frame(self, slot: int) -> memoryview:
        """Slot `slot`'s frame: its row at [lead, lead + row_nbytes), padding around it."""
        return memoryview(self._mm)[slot * self.stride:(slot + 1) * self.stride]

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
        if slots * self.stride > len(self._mm):            # grow past the mapping: a new one
            self._map(slots)
            for new, src in enumerate(keep.tolist()):
                self.bank[new].copy_(old[src])
            return self.bank
        for new, src in enumerate(keep.tolist()):
            if new != src:
                old[new].copy_(old[src])
        free_from = -(-slots * self.stride // mmap.PAGESIZE) * mmap.PAGESIZE
        if free_from < len(self._mm):                      # the tail's pages go back to the OS now
            self._mm.madvise(mmap.MADV_DONTNEED, free_from, len(self._mm) - free_from)
        self.bank = self._view(slots)
        return self.bank


def frame_of(bank, align: int) -> tuple[int, int | None]:
    """(lead, stride) of a bank's slot frames (`HostRows`) for O_DIRECT reads at `align`: the
    lead most of its pieces' file offsets share modulo `align` (those read straight into the
    slot, narrower ggml rows packed and then spread out in place; the others go through the
    bounce buffer); (0, None), today's packed rows, where
    reads are not direct or an expert has two pieces in one row (a span would overwrite the
    other's bytes)."""
    if align <= 1:
        return 0, None
    esize = torch.empty(0, dtype=bank.dtype).element_size()
    active = sum((pc.files >= 0).astype(np.int64) for pc in bank.pieces)
    if not len(bank.pieces) or int(np.max(active, initial=0)) > 1:
        return 0, None
    res = [((pc.offsets - pc.dst) % align)[pc.files >= 0] for pc in bank.pieces if pc.file_dtype is None]
    res = np.concatenate(res) if res else np.empty(0, np.int64)
    if not len(res):
        return 0, None
    vals, counts = np.unique(res, return_counts=True)
    lead = int(vals[np.argmax(counts)])
    if lead % esize:
        return 0, None
    row = int(np.prod(bank.row_shape, dtype=np.int64)) * esize
    return lead, -(-(lead + row) // align) * align
