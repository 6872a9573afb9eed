"""One expert's read in one C call (kernels/c/expert_read.c), for the experts whose every piece
host_cache.ExpertReader would read straight into the slot's frame (O_DIRECT, host_rows.py): the
same spans into the same places, the same xxh3 over the same bytes, the same narrow-row spread
and the same errors, without the Python a piece (memoryviews, ctypes addresses, numpy's
temporary for the spread: ~0.1-0.2 ms of a reader's CPU a read, holding the GIL the decode
thread waits for, issue 39). Every other expert (a bounce-buffered piece, a cast, buffered
reads) is read by the Python path, as before."""
from __future__ import annotations

import os

import numpy as np

from ...kernels import cpu_kernels
from . import hash_nogil

# the C read where it applies; False: every read through ExpertReader's Python path (the tests
# that inject faults into `os.preadv` read that path; the C one reads the file with pread)
ENABLED = True


class ReadPlan:
    """Every expert's pieces as the C read takes them (`fds`, `off`: [experts, pieces]; the
    pieces' places in slot 0's frames and the banks' strides), and which experts it can read
    (`ok`: each of its pieces framed, on an O_DIRECT fd of one alignment)."""

    def __init__(self, layout, dfds: list[int | None], aligns: list[int], rows: dict):
        self.lib, self.layout = cpu_kernels(), layout
        self.update = hash_nogil.update_address()      # the hashers' xxh3 update, called from C
        cols = [(name, pc) for name, bank in layout.banks.items() for pc in bank.pieces]
        self.names = [name for name, _ in cols]
        n, P = layout.num_layers * layout.num_experts, len(cols)
        direct = [a for a, fd in zip(aligns, dfds) if fd is not None]
        self.align = direct[0] if direct and len(set(direct)) == 1 else 0
        fd_of = np.array([-1 if fd is None else fd for fd in dfds], np.int64)
        self.fds = np.full((n, P), -1, np.int64)
        self.off = np.zeros((n, P), np.int64)
        self.nbytes = np.array([pc.nbytes for _, pc in cols], np.int64)
        self.rows = np.array([pc.rows if pc.pitch else 0 for _, pc in cols], np.int64)
        self.pitch = np.array([pc.pitch for _, pc in cols], np.int64)
        self.stride = np.array([rows[name].stride for name, _ in cols], np.int64)
        # where each piece lands in slot 0 (a bank's row starts `lead` into its frame: data_ptr)
        self.dst = np.array([rows[name].bank.data_ptr() + pc.dst for name, pc in cols], np.int64)
        self.ok = np.full(n, self.lib is not None and self.align > 0)
        for j, (name, pc) in enumerate(cols):
            here = pc.files >= 0
            fi = np.maximum(pc.files, 0)
            self.fds[:, j] = np.where(here, fd_of[fi], -1)
            self.off[:, j] = pc.offsets
            if not self.align:
                break
            a, r = self.align, rows[name]
            head = pc.offsets % a
            lo = r.lead + pc.dst - head                     # the span's start in the frame (ExpertReader._framed)
            hi = lo + -(-(head + pc.nbytes) // a) * a
            framed = pc.file_dtype is None and r.stride % a == 0 and (r.bank.data_ptr() - r.lead) % a == 0
            fits = framed & (fd_of[fi] >= 0) & (lo >= 0) & (hi <= r.stride) & (lo % a == 0)
            self.ok &= ~here | fits
        self.total = np.where(self.fds >= 0, self.nbytes, 0).sum(axis=1)
        self._fds_p, self._off_p = self.fds.ctypes.data, self.off.ctypes.data
        self._row_bytes = P * 8

    def read(self, flat: int, slot: int, h, fds: list[int]) -> tuple[int, str | None]:
        """Expert `flat` into slot `slot`'s frames, hashed into `h` (None: not hashed): (its
        bytes, None), or (0, the reader's "truncated" line) where the file ends inside a piece;
        a failed read raises the OSError it was."""
        P = len(self.names)
        got = np.zeros(P, np.int64)
        at = flat * self._row_bytes
        k = self.lib.ft_read_expert(P, self._fds_p + at, self._off_p + at, self.nbytes.ctypes.data,
                                    self.dst.ctypes.data, self.stride.ctypes.data, slot, self.align,
                                    self.rows.ctypes.data, self.pitch.ctypes.data,
                                    self.update if h is not None else None, h.state if h is not None else None,
                                    got.ctypes.data)
        if k < 0:
            raise OSError(-k, os.strerror(-k))
        if k < P:
            L, E = divmod(flat, self.layout.num_experts)
            pc = [pc for b in self.layout.banks.values() for pc in b.pieces][k]
            fi, off = int(pc.files[flat]), int(self.off[flat, k])
            return 0, (f"{self.layout.paths[fi]}: truncated: expert {E} of MoE layer {L} (bank {self.names[k]!r}) "
                       f"needs bytes {off}..{off + pc.nbytes} but the file has {os.fstat(fds[fi]).st_size}")
        return int(self.total[flat]), None

    def takes(self, flat: int, h) -> bool:
        """Whether the C read reads expert `flat` with hasher `h` (one of hash_nogil's, or none)."""
        return ENABLED and bool(self.ok[flat]) and (h is None or (self.update is not None
                                                                 and getattr(h, "state", None) is not None))
