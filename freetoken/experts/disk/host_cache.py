"""The host expert cache: the RAM tier between the model file and the compute.

N slots of whole experts (a row of every bank, as `ExpertPool` would hold it), keyed by
(layer, expert) through the same `SlotTable` as the device cache (residency, policy,
victims, locks, pending flags). A miss takes a victim slot and its bytes are read from the
file straight into the slot's rows (`os.preadv`, one call per contiguous piece; the GIL is
released while the disk works, so the reads of several experts are in flight at once on the
read queue's readers, `io_threads` in flight: the queue depth `freetoken profile` measures best,
and one more for a layer call's own reads, read_queue.py).
Where the filesystem allows, reads are O_DIRECT (direct.py: no page-cache copy; an unaligned
GGUF piece is read as its aligned span into a per-thread bounce buffer, or straight into the slot's
frame; an expert whose every piece lands in its frame is read, hashed and spread in one C call,
without the GIL: c_reads.py); otherwise buffered,
and after each read the file's pages are dropped from the page cache (`posix_fadvise(DONTNEED)`):
the slot is the copy in RAM, the page cache would be a second.
With a file watch (experts/disk/integrity.py) each expert's bytes are hashed (xxh3) as they land and a
mismatch with its checksum is an `ExpertReadError`, like a short read; a re-read of an expert that
already matched in the same file version is not hashed again (`ExpertFileWatch.known`).

Thread safety: every table change happens under one condition lock; the reads run outside
it. A slot being read is `pending` and locked by its reader: nobody reads its rows or evicts
it until the read has landed; a caller that needs it waits on its event. A failed read
(file shrunk or damaged) drops the slot again and raises `ExpertReadError` to every caller
that needed that expert; the cache stays consistent and keeps serving the others.
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from typing import Callable

import numpy as np
import torch

from .c_hits import HitCalls
from .c_reads import ReadPlan
from .hash_nogil import xxh3_64
from .pieces import DiskLayout
from .direct import Bounce, address, dio_align, open_direct, read_direct, read_exact, read_span
from .host_rows import HostRows, frame_of
from .read_queue import DEMAND, GUESS, ReadQueue
from ..memory.prefetch_budget import TransferBudget
from ..memory.slots import DEFAULT_POLICY, SlotTable


log = logging.getLogger("freetoken.experts")
# the slots' pages faulted in from the cache's start on an idle-priority thread (host_rows.py `populate`),
# not by the O_DIRECT reads that first land in them (a 3 MiB read into untouched memory: 0.47 ms of CPU
# against 0.075). Quiet, alternating (docs/benchmarks.md "Round 4, stop 59"): where a 4-token prompt leaves
# the cache to fill while decoding, decode 1.41x under the target's 10357 MiB cgroup and 1.26x without one;
# at the target's 64-token prompt (its populate done by the first decoded token) 1.02x, within the spread.
# (`tier39g` read losses under the cgroup at load 4-9, another engineer's 48-layer runs beside it.)
# `bench/disk_tier.py --populate on|off` for the A/B
POPULATE = True


class ExpertReadError(RuntimeError):
    """An expert's bytes could not be read from the model file (shrunk, damaged, I/O)."""


def _bytes_of(t: torch.Tensor) -> memoryview:
    return memoryview(t.view(torch.uint8).numpy()).cast("B")


def _same(a: memoryview, b: memoryview) -> bool:
    """Whether two byte views are the same memory (a read that landed in place)."""
    return len(a) == len(b) and np.frombuffer(a, np.uint8).__array_interface__["data"][0] == \
        np.frombuffer(b, np.uint8).__array_interface__["data"][0]


def _copy(dst: memoryview, src: memoryview) -> None:
    """dst[:] = src, through memmove without the GIL where both are writable memory (a slice
    assignment holds it for the whole copy, 0.2-0.4 ms a piece: the decode thread's Python waited)."""
    a, b = address(dst), address(src)
    if a and b and len(dst) == len(src):
        ctypes.memmove(a, b, len(src))
    else:
        dst[:] = src


class _SlotRows:
    """`ExpertReader.read`'s destination rows of one slot, each bank's row made only when a
    piece is not read into its frame (most reads never ask: no torch indexing a read)."""

    def __init__(self, banks: dict[str, torch.Tensor], slot: int):
        self.banks, self.slot = banks, slot

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.banks[name][self.slot]


class _SlotFrames:
    """`ExpertReader.read`'s frames of one slot, (frame, lead) by bank, made only when the
    Python path asks (the C read takes the slot's number)."""

    def __init__(self, rows: dict[str, HostRows], slot: int):
        self.rows, self.slot = rows, slot

    def get(self, name: str):
        r = self.rows.get(name)
        return None if r is None else (r.frame(self.slot), r.lead)


class ExpertReader:
    """Reads one expert's rows of every disk bank into given destination rows."""

    def __init__(self, layout: DiskLayout, drop_cache: bool = True, watch=None, direct_io: str = "auto"):
        self.layout, self.drop_cache, self.direct_io = layout, drop_cache, direct_io
        self.watch = watch           # disk_integrity.ExpertFileWatch: every read checked against its checksum
        self.fds: list[int] = []
        self.dfds: list[int | None] = []     # O_DIRECT fds (direct.py), None where refused or off
        self.bounce = Bounce()
        self.row_nbytes = {name: b.row_nbytes for name, b in layout.banks.items()}   # (a property that sums)
        self.plan: ReadPlan | None = None    # the C read (c_reads.py), once the slots' frames are known
        self._frames: dict | None = None
        self.open()

    def open(self) -> None:
        """(Re)open the files by path: a file replaced under its name is read as it is now."""
        fds = [os.open(p, os.O_RDONLY) for p in self.layout.paths]
        for fd in fds:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)   # no readahead beyond what we ask
        dfds = [open_direct(p, self.direct_io) for p in self.layout.paths]
        self.close()
        self.fds, self.dfds = fds, dfds
        self.aligns = [1 if fd is None else dio_align(fd) for fd in dfds]   # O_DIRECT: offset/length/memory
        if self._frames is not None:
            self.frame(self._frames)

    def frame(self, rows: dict) -> None:
        """The slots' frames (HostRows by bank) the C read puts pieces in: again after a resize
        moved them or the files were reopened."""
        self._frames = rows
        self.plan = ReadPlan(self.layout, self.dfds, self.aligns, rows)

    def _hasher(self, flat: int):
        """A hasher for expert `flat`'s bytes, or None: no watch, or already matched (`known`)."""
        return xxh3_64() if self.watch is not None and not self.watch.known(flat, self.fds) else None

    def _checked(self, flat: int, h) -> None:
        if h is not None:          # (None with a watch: an expert already matched in this file version)
            bad = self.watch.check(flat, h.intdigest())
            if bad:
                raise ExpertReadError(bad)


    def describe(self) -> dict:
        """How the reads go: O_DIRECT (how many of the files) or buffered."""
        n = sum(fd is not None for fd in self.dfds)
        return {"direct_io": self.direct_io, "direct_files": n, "mode": "direct" if n else "buffered"}

    def read(self, flat: int, dst, frames=None, slot: int | None = None) -> int:
        """Fills dst[bank] (one expert's row of each disk bank; a dict or `_SlotRows`); returns
        bytes read. frames[bank]: (the slot's frame, the row's lead in it; host_rows.py) -- a
        piece whose aligned span the frame holds is read straight into it, and hashed there (no
        bounce copy). `slot`: the frames are that slot's of the frames given to `frame`; an
        expert whose every piece lands in them is read in one C call (c_reads.py)."""
        total = 0
        h = self._hasher(flat)
        if slot is not None and self.plan is not None and self.plan.takes(flat, h):
            total, short = self.plan.read(flat, slot, h, self.fds)
            if short:
                raise ExpertReadError(short)
            self._checked(flat, h)
            return total
        for name, bank in self.layout.banks.items():
            row, fr = None, frames.get(name) if frames else None
            for pc in bank.pieces:
                if pc.files[flat] < 0:
                    continue
                fi, off = int(pc.files[flat]), int(pc.offsets[flat])
                direct = pc.file_dtype is None and not pc.pitch          # the bytes are the row's bytes
                framed = (fr[0], fr[1] + pc.dst) if pc.file_dtype is None and fr is not None else None
                buf, got = self._piece(fi, off, pc.nbytes, None, framed) if framed else (None, 0)
                in_frame = buf is not None
                if buf is None:                      # not framed: into the row, or via a buffer
                    row = _bytes_of(dst[name]) if row is None else row
                    buf, got = self._piece(fi, off, pc.nbytes, row[pc.dst:pc.dst + pc.nbytes] if direct else None)
                if got < pc.nbytes:
                    L, E = divmod(flat, self.layout.num_experts)
                    raise ExpertReadError(
                        f"{self.layout.paths[fi]}: truncated: expert {E} of MoE layer {L} (bank {name!r}) needs bytes "
                        f"{off}..{off + pc.nbytes} but the file has {os.fstat(self.fds[fi]).st_size}")
                if h is not None:
                    h.update(buf)
                if direct and not in_frame:
                    dst_view = row[pc.dst:pc.dst + pc.nbytes]
                    if buf is not dst_view and not _same(buf, dst_view):   # came through the bounce buffer
                        _copy(dst_view, buf)
                elif not direct and in_frame:        # narrower ggml rows, packed at the row's start
                    self._spread(fr[0][fr[1]:fr[1] + self.row_nbytes[name]], pc)
                elif not direct:
                    self._place(bank, pc, buf, dst[name])
                total += pc.nbytes
        self._checked(flat, h)
        return total

    def _framed(self, fi: int, off: int, nbytes: int, frame: memoryview, at: int) -> tuple[memoryview | None, int]:
        """The piece [off, off+nbytes) read as its aligned span straight into `frame`, the piece
        landing at frame[at:]: (its view there, bytes of it read); (None, 0) where this file is
        not read O_DIRECT or the span does not fall on the frame's alignment or fit in it."""
        dfd = self.dfds[fi] if fi < len(self.dfds) else None
        if dfd is None:
            return None, 0
        a = self.aligns[fi]
        head = off % a
        lo = at - head
        hi = lo + -(-(head + nbytes) // a) * a
        if lo < 0 or hi > len(frame) or (address(frame) + lo) % a:
            return None, 0
        got = read_span(dfd, frame[lo:hi], off - head)
        return frame[at:at + nbytes], max(0, min(nbytes, got - head))

    def _piece(self, fi: int, off: int, nbytes: int, dst: memoryview | None,
               framed: tuple[memoryview, int] | None = None) -> tuple[memoryview | None, int]:
        """One piece's bytes: (view, bytes read); into `dst` where given and possible. With
        `framed` (frame, where the piece lands in it): straight into the frame, or (None, 0)."""
        if framed is not None:
            return self._framed(fi, off, nbytes, *framed)
        dfd = self.dfds[fi] if fi < len(self.dfds) else None
        if dfd is not None:
            return read_direct(dfd, self.bounce, off, nbytes, dst)
        fd = self.fds[fi]
        buf = dst if dst is not None else memoryview(bytearray(nbytes))
        got = read_exact(fd, buf, off)
        if self.drop_cache:                  # the slot is the copy in RAM, not the page cache too
            os.posix_fadvise(fd, off, nbytes, os.POSIX_FADV_DONTNEED)
        return buf, got

    @staticmethod
    def _place(bank, pc, buf: memoryview, dst: torch.Tensor) -> None:
        src = torch.frombuffer(buf, dtype=torch.uint8)
        if pc.file_dtype is not None:             # float piece stored in another dtype: cast
            vals = src.view(pc.file_dtype).to(bank.dtype)
            es = vals.element_size()
            dst.view(torch.uint8).view(-1)[pc.dst:pc.dst + vals.numel() * es] = vals.view(torch.uint8)
            return
        rb = pc.nbytes // pc.rows                  # ggml rows narrower than the bank row; numpy: torch's
        #                                            strided uint8 copy took 30 ms an expert here, numpy's 0.1
        flat = dst.view(torch.uint8).view(-1).numpy()[pc.dst:pc.dst + pc.rows * pc.pitch].reshape(pc.rows, pc.pitch)
        flat[:, :rb] = np.frombuffer(buf, np.uint8).reshape(pc.rows, rb)
        flat[:, rb:] = 0

    @staticmethod
    def _spread(row: memoryview, pc) -> None:
        """A piece of narrower ggml rows read packed into its place in the row: each row moved
        out to the bank's pitch, in place (numpy copies overlapping views through a temporary:
        the bytes just hashed, in cache), the padding zeroed."""
        rb = pc.nbytes // pc.rows
        u8 = np.frombuffer(row, np.uint8)
        out = u8[pc.dst:pc.dst + pc.rows * pc.pitch].reshape(pc.rows, pc.pitch)
        out[:, :rb] = u8[pc.dst:pc.dst + pc.nbytes].reshape(pc.rows, rb)
        out[:, rb:] = 0

    def close(self) -> None:
        self.plan = None                     # (its fds are closed here)
        for fd in (*self.fds, *self.dfds):
            if fd is not None:
                os.close(fd)
        self.fds, self.dfds = [], []


class HostExpertCache:
    """`slots` whole experts in host memory over the file described by `layout`."""

    def __init__(self, layout: DiskLayout, slots: int, policy: str = DEFAULT_POLICY, threads: int = 4,
                 drop_cache: bool = True, watch=None, direct_io: str = "auto",
                 read_budget: float | None = None):
        if slots < 1:
            raise ValueError(f"host expert cache: at least 1 slot, got {slots}")
        self.layout = layout
        n_flat = layout.num_layers * layout.num_experts
        self.table = SlotTable(n_flat, layout.num_experts, int(slots), policy)
        # read-ahead within `read_budget` x the reads without guessing (backend.READ_BUDGET); None: unbounded
        if read_budget is not None:         # counted by the table (`record`, `assign`) as in the device tier
            self.table.budget = TransferBudget(n_flat, read_budget)
        self.reader = ExpertReader(layout, drop_cache, watch, direct_io)
        align = max((a for a, fd in zip(self.reader.aligns, self.reader.dfds) if fd is not None), default=1)
        self._rows = {name: HostRows(slots, b.row_shape, b.dtype, *frame_of(b, align))   # fresh pages: nothing
                      for name, b in layout.banks.items()}                                # touched until a read
        self.banks: dict[str, torch.Tensor] = {name: r.bank for name, r in self._rows.items()}
        for name, t in layout.resident.items():     # empty slots hold expert 0's (valid ggml type ids)
            self.banks[name] = t[:1].expand(slots, *t.shape[1:]).clone()
        self._small_views()
        self.reader.frame(self._rows)
        self._cv = threading.Condition()
        self._waiters = 0                                   # callers in acquire's wait for a free slot
        self._landed: dict[int, threading.Event] = {}      # slot -> set when its read is over
        self._failed: dict[int, BaseException] = {}        # flat -> the read error (until retried)
        self._prefetched = np.zeros(slots, bool)           # filled by a prefetch, not yet used
        self._any_prefetched = False                       # ... some slot may be (the hit path skips the look)
        # the hit path (`acquire_hits`, issue 39: a call at full hits costs what a resident call
        # costs): one lookup in `ready_of`, kept up to date as reads land and slots are evicted,
        # and the policy's bookkeeping of a pass's hit calls done at once (`_settle`), before the
        # policy next decides anything
        self.ready_of = np.full(len(self.table.slot_of), -1, np.int64)   # flat -> slot once landed, else -1
        self.identity = True       # every resident expert in the slot of its flat id (a whole-pool cache):
        #                            then any call's slots ascend with its ids
        self._hit_log: list[np.ndarray] = []               # hit calls' unique ids, not yet in the policy
        self.hits_c = HitCalls.of("native")                # the hit path's lock in C (None: numpy; tests set either)
        self._log_layer = -1
        self._io = ReadQueue(threads, self._read_into, reserve=True)   # demand reads first (and a reader of
        #                                                  their own), guesses cancellable
        self.c = dict(hits=0, misses=0, waited=0, reads=0, bytes_read=0, prefetches=0, prefetch_used=0,
                      read_errors=0, cancelled=0, budget_cut=0)
        self.read_s = 0.0            # wall time callers waited for reads
        self.unplaced = 0            # of the last `prefetch`'s ids not resident, those it did not start: a
        #                              later call with the same ids has nothing to do while it is 0
        self.on_block: Callable[[], None] | None = None    # called as a caller starts to wait on a read
        #                                                    (the disk tier parks the kernel pool's workers)
        self._stop_populate = threading.Event()
        self.populated = 0           # bytes of the banks' pages faulted in ahead (`POPULATE`)
        self._start_populate()

    def _start_populate(self) -> None:
        if POPULATE:
            threading.Thread(target=_populate, args=(self, list(self._rows.values()), self._stop_populate),
                             name="freetoken-disk-populate", daemon=True).start()

    capacity = property(lambda self: self.table.capacity)
    resident = property(lambda self: self.table.resident)
    evictions = property(lambda self: self.table.evictions)

    def _small_views(self) -> None:
        """numpy views of the tiny resident banks (ggml type ids) and their sources: a read
        sets its slot's row with one numpy assignment (torch's indexing and copy_ took ~30 us
        of an I/O thread's CPU a read, issue 39)."""
        self._small = [(self.banks[k].numpy(), t.numpy()) for k, t in self.layout.resident.items()]

    # ---- reading ----------------------------------------------------------------------
    def _read_into(self, flat: int, slot: int) -> None:
        """Runs on an I/O thread: the slot's rows from the file; then the slot is readable."""
        err = None
        try:
            n = self.reader.read(flat, _SlotRows(self.banks, slot), _SlotFrames(self._rows, slot), slot)
            for dst, src in self._small:
                dst[slot] = src[flat]
        except BaseException as e:  # noqa: BLE001 -- handed to every waiter
            err = e if isinstance(e, ExpertReadError) else ExpertReadError(
                f"{self.layout.paths[0]}: reading expert {flat % self.layout.num_experts} of MoE layer "
                f"{flat // self.layout.num_experts} failed: {e}")
        with self._cv:
            if err is None:
                self.c["reads"] += 1
                self.c["bytes_read"] += n
                self.table.ready(np.array([slot]))
                self.ready_of[flat] = slot
            else:
                self.c["read_errors"] += 1
                self._failed[flat] = err
                self._drop(slot)
            self._landed.pop(slot).set()
            self._cv.notify_all()

    def _drop(self, slot: int) -> None:
        """Empty a slot whose read failed (under the lock; its locks stay with their holders)."""
        t = self.table
        flat = int(t.owner[slot])
        if flat >= 0:
            t.slot_of[flat] = -1
            self.ready_of[flat] = -1
        t.owner[slot], t.stamp[slot], t.pending[slot] = -1, -1, False
        if t.arc is not None:
            t.arc.keep(set(t.owner[t.owner >= 0].tolist()), t.capacity)

    def _victims(self, flats: np.ndarray, whole_pool_only: bool = False) -> np.ndarray | None:
        """Slots for the misses `flats` (under the lock). Where the cache can hold the whole pool,
        expert f goes to slot f while that is free: every call's slots then ascend with its ids
        and a call at full hits is one kernel call, as on the resident pool (issue 39: 1.4 kernel
        calls a layer call at hits on the medium Q3_K_M model otherwise). Else the policy's
        victims (`whole_pool_only`: None)."""
        t = self.table
        if t.capacity >= len(t.slot_of) and len(flats):
            if ((t.owner[flats] < 0) & (t.locks[flats] == 0) & ~t.pending[flats]).all():
                return flats.copy()
        return None if whole_pool_only else t.candidates(len(flats), flats)

    def _start(self, flats: np.ndarray, slots: np.ndarray, priority: int = DEMAND) -> list[threading.Event]:
        """Assign flats into victim slots (locked, pending) and queue their reads (under the lock)."""
        self._settle()              # (the policy sees the logged hits before these reads, as they came)
        old = self.table.owner[slots]
        self.ready_of[old[old >= 0]] = -1
        if self.identity and (flats != slots).any():
            self.identity = False
        self.table.assign(flats, slots)
        events, fs, ss = [], flats.tolist(), slots.tolist()
        for f, s in zip(fs, ss):
            self._failed.pop(f, None)
            ev = self._landed[s] = threading.Event()
            events.append(ev)
        self._io.put_many((f, s, priority) for f, s in zip(fs, ss))
        return events

    # ---- callers ------------------------------------------------------------------------
    def acquire(self, flat_ids: np.ndarray) -> tuple[int, np.ndarray]:
        """Make a leading run of `flat_ids` (unique) resident and lock it: returns (n, slots of
        flat_ids[:n]), n >= 1. Fewer than all when the free slots cannot hold every miss at
        once: the caller runs them, `release`s and asks for the rest. Raises ExpertReadError
        when one of them cannot be read (the others are released)."""
        n, slots, pending = self.acquire_nowait(flat_ids)
        try:
            self.landed(np.asarray(flat_ids, np.int64)[:n], pending)
        except ExpertReadError:
            self.release(slots)
            raise
        return n, slots

    def acquire_hits(self, layer: int, uniq: np.ndarray, flat: np.ndarray) -> tuple[np.ndarray, bool, np.ndarray] | None:
        """`acquire` of a layer call whose experts (`uniq`: its unique flat ids, ascending;
        `flat`: the call's [T, K] ids) are all resident and landed: (the slots of `flat`,
        whether the slots of `uniq` ascend too: one kernel call, the locked slots to give to
        `release_hits`); None, and nothing changed, otherwise. One gather and a lock (one C
        call, c_hits.py); the policy sees the call at the next `_settle`, in the same order as
        if it had been told now."""
        with self._cv:
            if self.hits_c is not None:
                got = self.hits_c.acquire(self.ready_of, self.table.locks, self._prefetched, uniq, flat)
                if got is None:
                    return None
                slots, held, ordered, used = got
                ordered = ordered or self.identity
            else:
                slots = self.ready_of[flat]
                if slots.min() < 0:
                    return None
                self.table.locks[slots] += 1        # repeated slots count once, and the release takes one
                held, ordered, used = slots, self.identity, 0
                if self._any_prefetched or not ordered:
                    su = self.ready_of[uniq]
                    ordered = ordered or len(su) < 2 or bool((su[1:] > su[:-1]).all())
                    was = self._prefetched[su]
                    used = int(was.sum())
                    self._prefetched[su] = False
            if used:
                self.c["prefetch_used"] += used
                self._any_prefetched = bool(self._prefetched.any())
            if layer <= self._log_layer:        # a new pass: the last one's hits go to the policy
                self._settle()
            self._hit_log.append(uniq)
            self._log_layer = layer
            self.c["hits"] += len(uniq)
            return slots, ordered, held

    def release_hits(self, held: np.ndarray) -> None:
        """`release` of `acquire_hits`' slots (its third item; a repeated slot was locked once)."""
        if self.hits_c is None:
            return self.release(held)
        with self._cv:
            self.hits_c.release(self.table.locks, held)
            if self._waiters:
                self._cv.notify_all()

    def _settle(self) -> None:
        """The logged hit calls to the policy (under the lock): counted and touched as one
        batch (their layers ascend: `SlotTable.record` takes a pass's calls at once)."""
        if self._hit_log:
            ids = self._hit_log[0] if len(self._hit_log) == 1 else np.concatenate(self._hit_log)
            self._hit_log, self._log_layer = [], -1
            self.table.record(ids)
            self.table.touch(self.table.slot_of[ids])

    def acquire_nowait(self, flat_ids: np.ndarray) -> tuple[int, np.ndarray, list]:
        """`acquire` without waiting for the reads: (n, slots, pending), pending[i] the Event
        of flat_ids[i]'s read still in flight (None: its bytes are in). The slots are locked
        either way; the caller reads slot i only after `landed` for it, and `release`s all."""
        flat_ids = np.asarray(flat_ids, np.int64)
        t = self.table
        with self._cv:
            self._settle()
            slots = t.slot_of[flat_ids]
            if (slots >= 0).all() and not t.pending[slots].any():      # all landed hits: the common case
                t.record(flat_ids)
                t.lock(slots)
                t.touch(slots)
                n = len(flat_ids)
                self.c["hits"] += n
                used = self._prefetched[slots]
                if used.any():
                    self.c["prefetch_used"] += int(used.sum())
                    self._prefetched[slots] = False
                return n, slots, [None] * n
            while True:
                slots = t.slot_of[flat_ids]
                hit = slots >= 0
                # the longest prefix whose misses fit the evictable slots left after locking its hits
                free_after = t.evictable() - np.cumsum(hit & (t.locks[np.maximum(slots, 0)] == 0)
                                                       & ~t.pending[np.maximum(slots, 0)])
                need = np.cumsum(~hit)
                ok = need <= free_after
                n = len(flat_ids) if ok.all() else int(np.argmin(ok))
                if n > 0:
                    break
                if not t.pending.any() and not t.locks.any():
                    raise RuntimeError("host expert cache: no slot can be freed")
                self._waiters += 1
                try:
                    self._cv.wait(0.05)             # every slot locked by other callers or reads
                finally:
                    self._waiters -= 1
            ids, hit, slots = flat_ids[:n], hit[:n], slots[:n].copy()
            t.record(ids)
            t.lock(slots[hit])
            t.touch(slots[hit])
            pending: list = [None] * n
            for i in np.flatnonzero(hit).tolist():
                if t.pending[slots[i]]:
                    pending[i] = self._landed[int(slots[i])]
                    self._io.promote(int(slots[i]))       # a guess still queued, needed now
            landed = hit.copy()
            landed[hit] = ~t.pending[slots[hit]]
            self.c["hits"] += int(landed.sum())
            self.c["waited"] += int(hit.sum() - landed.sum())
            self.c["misses"] += int((~hit).sum())
            used = slots[hit]
            self.c["prefetch_used"] += int(self._prefetched[used].sum())
            self._prefetched[used] = False
            miss = ids[~hit]
            if len(miss):
                victims = self._victims(miss)
                slots[~hit] = victims
                self._prefetched[victims] = False
                for i, ev in zip(np.flatnonzero(~hit).tolist(), self._start(miss, victims)):
                    pending[i] = ev
        return n, slots, pending

    def landed(self, flat_ids: np.ndarray, pending: list) -> None:
        """Wait for the reads in `pending` (aligned with `flat_ids`, from `acquire_nowait`);
        raises ExpertReadError when one of those experts could not be read (their slots stay
        locked: the caller releases them)."""
        waits = [ev for ev in pending if ev is not None and not ev.is_set()]
        if waits:
            if self.on_block is not None:
                self.on_block()
            t0 = time.perf_counter()
            for ev in waits:
                ev.wait()
            self.read_s += time.perf_counter() - t0
        if any(ev is not None for ev in pending):
            with self._cv:
                bad = [self._failed[f] for f, ev in zip(np.asarray(flat_ids).tolist(), pending)
                       if ev is not None and f in self._failed and self.table.slot_of[f] < 0]
            if bad:
                raise bad[0]

    def wait_any(self, pending: list) -> None:
        """Wait until one of the reads in `pending` (Events from `acquire_nowait`; None: landed)
        is over, whichever lands first (a layer call then runs it while the others read; waiting
        for one read in particular left the kernels idle while others had landed)."""
        if any(ev is None or ev.is_set() for ev in pending):
            return
        if self.on_block is not None:
            self.on_block()
        t0 = time.perf_counter()
        with self._cv:                      # a read's event is set under this lock, then notified
            while not any(ev.is_set() for ev in pending):
                self._cv.wait(0.05)
        self.read_s += time.perf_counter() - t0

    def over_capacity(self) -> bool:
        """Whether the last decode pass routed more experts than the cache holds and the policy is
        layer-aware: the read-ahead then takes the slots of the layer just run (handoff.py)."""
        return self.table.layer_aware and self.table.working_set > self.table.capacity

    def victims_among(self, slots: np.ndarray, k: int) -> np.ndarray:
        """Positions in `slots` (one layer call's, locked) of the k that the policy gives up first
        once they are free: the least score, ties to the least recently used (the order of
        `SlotTable.candidates` within one layer)."""
        with self._cv:
            self._settle()
            t = self.table
            return np.lexsort((t.stamp[slots], t.score(t.owner[slots])))[:k]

    def release(self, slots: np.ndarray) -> None:
        with self._cv:
            self.table.locks[np.asarray(slots, np.int64)] -= 1     # a call's slots are unique: no np.add.at
            if self._waiters:               # a caller waits for a slot to free (rare: a full cache)
                self._cv.notify_all()

    def prefetch(self, flat_ids: np.ndarray, budgeted: bool = True) -> int:
        """Start background reads of those of `flat_ids` (soonest needed first, likeliest first) not
        resident, into victims the policy gives up without waiting (never a locked slot); returns how
        many were started; never into the slot of an expert needed as soon (`SlotTable.read_ahead_victims`).
        `budgeted` (guesses): only as many as the read budget has room for (`READ_BUDGET`), the
        likeliest first; they are queued behind every demand read and may be cancelled (`cancel_guesses`)."""
        with self._cv:
            t = self.table
            want = np.asarray(flat_ids, np.int64)
            want = want[t.slot_of[want] < 0]
            self.unplaced = len(want)
            if not len(want):
                return 0
            self._settle()
            if budgeted and t.budget is not None:
                room = t.budget.room()
                if len(want) > room:
                    self.c["budget_cut"] += len(want) - room
                    want = want[:room]
                    if not len(want):
                        return 0
            slots = self._victims(want, whole_pool_only=True)
            if slots is None:
                want, slots = t.read_ahead_victims(want)
            if len(want) > 1:       # queued as a layer call computes them (soonest layer, then ascending
                o = np.lexsort((want, t.next_use(want)))    # ids): its landed prefix runs while the rest read
                want, slots = want[o], slots[o]
            if not len(want):
                return 0
            self._start(want, slots, GUESS if budgeted else DEMAND)
            t.unlock(slots)          # a prefetch holds no user lock: pending keeps it safe
            if t.budget is not None and budgeted:
                t.budget.prefetched(want)
            elif t.budget is not None:       # a sure read (a prefill's second buffer) is no guess: the
                t.budget.transfers -= len(want)     # budget neither charges it nor counts its use
            self._prefetched[slots] = True
            self._any_prefetched = True
            self.c["prefetches"] += len(want)
            self.unplaced -= len(want)
            return len(want)

    def cancel_guesses(self, layer: int, uniq: np.ndarray) -> int:
        """A call of `layer` routed `uniq` (its unique flat ids): the guesses for that layer still
        queued that it did not route will never be used before the layer comes round again, so
        their reads are dropped before they start and their slots emptied (the bytes read for
        nothing on spread routing, issue 39). Returns how many."""
        if not self._io.guesses:
            return 0
        E, n = self.layout.num_experts, 0
        with self._cv:
            t = self.table
            for flat, slot in self._io.queued_guesses():
                if flat // E != layer or t.locks[slot] or (uniq == flat).any() or not self._io.cancel(slot):
                    continue
                self._drop(slot)
                self._prefetched[slot] = False
                if t.budget is not None:
                    t.budget.uncopied(flat)
                self._landed.pop(slot).set()
                n += 1
            self.c["cancelled"] += n
            if n:
                self._cv.notify_all()
        return n

    def drain(self) -> None:
        """Wait for every read in flight (between steps, before a resize or close)."""
        with self._cv:
            self._settle()
            events = list(self._landed.values())
        for ev in events:
            ev.wait()

    def drop_all(self) -> int:
        """Between steps: empty every slot (the file changed: nothing read from it is kept) and
        reopen the files; reads in flight land first. Returns how many experts were dropped."""
        self.drain()
        with self._cv:
            if self.table.locks.any():
                raise RuntimeError("host expert cache: drop while a layer call is running")
            used = np.flatnonzero(self.table.owner >= 0)
            for slot in used.tolist():
                self._drop(slot)
            self._prefetched[:] = False
            self._any_prefetched = False
            self.identity = True
            self._failed.clear()
            try:
                self.reader.open()          # the name may now be another file (replaced, restored)
            except OSError:                 # gone for now: reads keep failing on the old file, clearly
                pass
            return len(used)

    def resize(self, slots: int) -> int:
        """Elastic memory, between steps: `slots` slots, keeping the residents the policy values
        most (its last victims); the freed slots' memory goes back to the OS (host_rows.py).
        Every read in flight (a background prefetch) lands first, so none writes a slot that
        moves or goes. Returns how many residents stayed."""
        if slots < 1:
            raise ValueError(f"host expert cache: at least 1 slot, got {slots}")
        self.drain()
        with self._cv:
            if self._landed or self.table.locks.any():
                raise RuntimeError("host expert cache: resize while a layer call or a read is running")
            self._settle()
            keep = self.table.keep_best(slots)
            for name, rows in self._rows.items():
                self.banks[name] = rows.resize(keep, slots)
            idx = torch.from_numpy(keep)
            for name, t in self.layout.resident.items():
                new = t[:1].expand(slots, *t.shape[1:]).clone()
                new[:len(keep)] = self.banks[name][idx]
                self.banks[name] = new
            self._small_views()
            self.reader.frame(self._rows)
            self._start_populate()      # (the old populate stops at the resize; a grown map's new pages too)
            was = self._prefetched
            self._prefetched = np.zeros(slots, bool)
            self._prefetched[:len(keep)] = was[keep]
            self._any_prefetched = bool(self._prefetched.any())
            t = self.table
            used = np.flatnonzero(t.owner >= 0)
            self.ready_of[:] = -1
            self.ready_of[t.owner[used]] = used
            self.identity = bool((t.owner[used] == used).all())
            return len(keep)

    def stats(self) -> dict:
        with self._cv:
            self._settle()
            c = dict(self.c)
            desc = self.table.describe()
            unused_now = int(self._prefetched.sum())          # prefetched, still resident, not used yet
        looked = c["hits"] + c["waited"] + c["misses"]
        S = self.layout.expert_nbytes
        # next-layer guesses: the share used before eviction, and the bytes read for nothing
        started = c["prefetches"] - c["cancelled"]          # (a cancelled guess read nothing)
        desc["prefetch_hit_rate"] = c["prefetch_used"] / started if started > 0 else 0.0
        desc["prefetch_wasted_bytes"] = max(0, c["prefetches"] - c["prefetch_used"] - unused_now - c["cancelled"]) * S
        desc.pop("prefetch_used", None)             # (the budget's count of the table; the cache's own is c's)
        return {**c, **desc, "hit_rate": (c["hits"] + c["waited"]) / looked if looked else 0.0,
                "slots": self.capacity, "resident": self.resident, "evictions": self.evictions,
                "gib": self.capacity * S / 2**30, "read_s": self.read_s, "populated_gib": self.populated / 2**30,
                "read_gbs": c["bytes_read"] / self.read_s / 1e9 if self.read_s else 0.0}

    def check(self) -> None:
        """Invariants (tests): the table's, plus: a slot is pending exactly while its read runs."""
        with self._cv:
            self._settle()
            t = self.table
            t.check()
            assert set(np.flatnonzero(t.pending).tolist()) == set(self._landed), "pending != reads in flight"
            landed = np.where(t.slot_of >= 0, t.slot_of, -1)
            landed[landed >= 0] = np.where(t.pending[landed[landed >= 0]], -1, landed[landed >= 0])
            assert np.array_equal(self.ready_of, landed), "ready_of != the landed residents"
            used = np.flatnonzero(t.owner >= 0)
            assert not self.identity or (t.owner[used] == used).all(), "identity set, a slot holds another id"
            assert self._any_prefetched or not self._prefetched.any()

    def close(self) -> None:
        self._stop_populate.set()
        self.drain()
        self._io.shutdown()
        self.reader.close()


def _populate(cache: HostExpertCache, rows: list[HostRows], stop: threading.Event) -> None:
    """The banks' pages faulted in (`POPULATE`) on a thread of their own, under SCHED_IDLE where the
    OS has it: only CPU nothing else wants (a start-up's waits on the disk, a step's waits on reads,
    an idle server). At normal priority it took a core from the start-up: the 48-layer file's first
    token 11.2 s against 4.7 (a 1.63 GiB host cache on this VM, where a first touch costs up to ~2 ms a MiB)."""
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except OSError:
            pass
    t0 = time.perf_counter()
    for r in rows:
        cache.populated += r.populate(stop)
    log.debug("host cache: %.2f GiB of pages faulted in, %.2f s", cache.populated / 2**30, time.perf_counter() - t0)
