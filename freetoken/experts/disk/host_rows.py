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

Pages faulted in ahead (`populate`, issue 39): a page's first touch zeroes it (2 MiB at once
on a huge page), and that touch is the O_DIRECT read's: while a fresh cache fills (a 48-layer
prompt and first decoded tokens: ~170 MB read a token into untouched slots) the readers zero
every byte they read on the cores the kernels use (`clear_page_erms`, ~13% of the process's CPU
in a perf profile of those tokens). `populate` faults the pages in without
changing a byte (`MADV_POPULATE_WRITE`, Linux 5.14+), so it may run beside reads into the same
slots; the host cache can run it from its start (`host_cache.POPULATE`, off: see there).
"""
from __future__ import annotations

import ctypes
import mmap
import threading

import numpy as np
import torch

_MADV_POPULATE_WRITE = 23       # (linux/mman.h; the mmap module of Python 3.11 does not name it)
# a madvise's bytes: one huge page, so the call holds the process's mmap lock (and a resize this
# lock) for one page's zeroing (~0.3-5 ms) even where its idle-priority thread is preempted in it
_POPULATE_CHUNK = 2 << 20


class HostRows:
    def __init__(self, slots: int, row_shape: tuple[int, ...], dtype: torch.dtype, lead: int = 0,
                 stride: int | None = None):
        self.row_shape, self.dtype = tuple(row_shape), dtype
        self.esize = torch.empty(0, dtype=dtype).element_size()
        self.row_nbytes = int(np.prod(row_shape, dtype=np.int64)) * self.esize
        self.lead, self.stride = int(lead), self.row_nbytes if stride is None else int(stride)
        self._lock = threading.Lock()       # `populate`'s chunk against a resize's DONTNEED or new map
        if self.lead % self.esize or self.stride % self.esize or self.lead + self.row_nbytes > self.stride:
            raise ValueError(f"host rows: lead {lead} and stride {stride} do not frame {self.row_nbytes}-byte rows "
                             f"of {dtype}")
        self._map(slots)

    def _map(self, slots: int) -> None:
        self.slots = slots
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

    def populate(self, stop: threading.Event, chunk: int = _POPULATE_CHUNK) -> int:
        """Faults in the pages of the live slots, `chunk` bytes a call, without changing their bytes
        (see the module doc); stops at `stop`, at a resize (its mapping or span changed), or where
        the OS has no `MADV_POPULATE_WRITE`. Returns the bytes faulted in."""
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        with self._lock:
            mm, end = self._mm, self.slots * self.stride
            base = torch.frombuffer(mm, dtype=torch.uint8, count=1).data_ptr()
        done = 0
        while done < end and not stop.is_set():
            with self._lock:            # (ctypes lets go of the GIL during the call)
                if self._mm is not mm or self.slots * self.stride < end:
                    break
                n = min(chunk, end - done)
                if madvise(base + done, n, _MADV_POPULATE_WRITE) != 0:
                    break               # (EINVAL: a kernel before 5.14; ENOMEM / EFAULT: give up quietly)
            done += n
        return done

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
        with self._lock:
            return self._resize(keep, slots)

    def _resize(self, keep: np.ndarray, slots: int) -> torch.Tensor:
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
        self.slots = slots
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
