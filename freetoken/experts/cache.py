"""The accelerator-side expert cache: N slots shared by every MoE layer.

Each slot holds one complete expert (a row of every bank, same bank keys as the
pool). Residency and recency are tracked by logical flat id (layer*E + expert):

  slot_of[flat]  -> slot or -1          (residency table, [L*E])
  owner[slot]    -> flat id or -1       (reverse map)
  stamp[slot]    -> last use, -1 empty  (one global LRU over all layers)
  locks[slot]    -> users this step     (locked slots are never victims)
  pending[slot]  -> a fill is in flight (not yet readable, not evictable)

Every touch takes a fresh stamp, so the LRU order is total and matches an ordered
dict that moves each touched key to the end. `candidates(k)` finds the k
least-recently-used evictable slots in one pass (empty slots first); the miss path
consumes them in order. Control lives on the host; the banks live on `device`
(on a CPU-only machine a separate host region, filled by real copies).

The pool is never touched except to read rows from it, so `resize` can rebuild the
slot banks at any safe point (no step in flight) keeping the most recent residents.
"""
from __future__ import annotations

import numpy as np
import torch

from .pool import ExpertPool
from .transfer import CopyEngine, CopyJob, SyncCopyEngine

_NEVER = np.iinfo(np.int64).max


class ExpertCache:
    def __init__(self, pool: ExpertPool, slots: int, device: torch.device,
                 copy_engine: CopyEngine | None = None):
        self.pool = pool
        self.device = torch.device(device)
        self.copy = copy_engine or SyncCopyEngine()
        self.slot_of = np.full(pool.num_layers * pool.num_experts, -1, np.int64)
        self.clock = 0
        self.evictions = 0
        self._landing: list[tuple[CopyJob, np.ndarray]] = []
        self._alloc(int(slots))

    def _alloc(self, slots: int) -> None:
        if slots < 0:
            raise ValueError(f"expert cache slots must be >= 0, got {slots}")
        self.capacity = slots
        self.banks = {k: torch.empty((slots, *b.shape[1:]), dtype=b.dtype, device=self.device)
                      for k, b in self.pool.banks.items()}
        self.owner = np.full(slots, -1, np.int64)
        self.stamp = np.full(slots, -1, np.int64)
        self.locks = np.zeros(slots, np.int32)
        self.pending = np.zeros(slots, bool)

    # ---- lookup and recency -------------------------------------------------------
    def lookup(self, flat_ids: np.ndarray) -> np.ndarray:
        return self.slot_of[flat_ids]

    def touch(self, slots: np.ndarray) -> None:
        n = len(slots)
        self.stamp[slots] = np.arange(self.clock + 1, self.clock + 1 + n)
        self.clock += n

    def lock(self, slots: np.ndarray) -> None:
        np.add.at(self.locks, slots, 1)

    def unlock(self, slots: np.ndarray) -> None:
        np.add.at(self.locks, slots, -1)

    def lru_order(self) -> list[int]:
        """Resident flat ids, least recent first (for tests and resize)."""
        used = np.flatnonzero(self.owner >= 0)
        return self.owner[used[np.argsort(self.stamp[used])]].tolist()

    @property
    def resident(self) -> int:
        return int((self.owner >= 0).sum())

    def evictable(self) -> int:
        return int(((self.locks == 0) & ~self.pending).sum())

    # ---- victims and fills ------------------------------------------------------------
    def candidates(self, k: int) -> np.ndarray:
        """Up to k evictable slots, least recent first (empty slots before all others)."""
        if k <= 0 or self.capacity == 0:
            return np.empty(0, np.int64)
        idx = np.arange(self.capacity)
        key = np.where(self.stamp < 0, idx - self.capacity - 1, self.stamp)
        key[(self.locks > 0) | self.pending] = _NEVER
        k = min(k, self.capacity)
        part = np.argpartition(key, k - 1)[:k] if k < self.capacity else idx
        part = part[np.argsort(key[part], kind="stable")]
        return part[key[part] != _NEVER]

    def install(self, flat_ids: np.ndarray, slots: np.ndarray, background: bool = False) -> CopyJob | None:
        """Evict the slots' owners, map flat_ids into them (locked, most recent) and start the
        copies. Sync fills: the caller waits on the job (`ready`). Background fills stay pending
        and locked until `poll` sees them land."""
        if len(flat_ids) == 0:
            return None
        old = self.owner[slots]
        gone = old[old >= 0]
        self.slot_of[gone] = -1
        self.evictions += len(gone)
        self.owner[slots] = flat_ids
        self.slot_of[flat_ids] = slots
        self.touch(slots)
        self.lock(slots)
        self.pending[slots] = True
        pairs = []
        src_idx = flat_ids.tolist()
        for k, dst in self.banks.items():
            src = self.pool.banks[k]
            pairs += [(dst[s], src[f]) for s, f in zip(slots.tolist(), src_idx)]
        job = self.copy.submit(pairs, len(flat_ids) * self.pool.expert_nbytes)
        if background:
            self._landing.append((job, slots))
        return job

    def ready(self, job: CopyJob | None, slots: np.ndarray) -> None:
        """Later device work reads the job's rows: make it wait for them."""
        if job is not None:
            self.copy.device_wait(job)
        self.pending[slots] = False

    def poll(self) -> list[CopyJob]:
        """Background fills that have landed become readable and evictable."""
        landed, still = [], []
        for job, slots in self._landing:
            if job.done():
                job.wait()
                self.pending[slots] = False
                self.unlock(slots)
                landed.append(job)
            else:
                still.append((job, slots))
        self._landing = still
        return landed

    def link_busy(self) -> bool:
        return any(not job.done() for job, _ in self._landing)

    def drain(self) -> list[CopyJob]:
        for job, _ in self._landing:
            job.wait()
        return self.poll()

    # ---- elastic ---------------------------------------------------------------------
    def resize(self, slots: int) -> None:
        """Rebuild with `slots` slots at a safe point, keeping the most recent residents.
        The pool is not touched; survivors are copied slot to slot on the device."""
        self.drain()
        if self.locks.any():
            raise RuntimeError("expert cache resize outside a safe point (slots are in use)")
        used = np.flatnonzero(self.owner >= 0)
        keep = used[np.argsort(-self.stamp[used])][:max(int(slots), 0)]
        keep = keep[np.argsort(self.stamp[keep])]          # least recent first
        old_banks, old_owner, old_stamp = self.banks, self.owner, self.stamp
        self.banks = {}                                     # drop references before allocating
        idx = torch.as_tensor(keep, dtype=torch.long, device=self.device)
        kept = {k: b.index_select(0, idx) for k, b in old_banks.items()}
        del old_banks
        self._alloc(int(slots))
        n = len(keep)
        for k, b in self.banks.items():
            b[:n].copy_(kept[k])
        del kept
        self.slot_of[:] = -1
        self.owner[:n] = old_owner[keep]
        self.stamp[:n] = old_stamp[keep]
        self.slot_of[self.owner[:n]] = np.arange(n)

    def check(self) -> None:
        """Invariants (tests call this after every operation)."""
        res = np.flatnonzero(self.slot_of >= 0)
        assert len(res) <= self.capacity
        assert np.array_equal(self.owner[self.slot_of[res]], res), "residency table != reverse map"
        used = self.owner[self.owner >= 0]
        assert len(np.unique(used)) == len(used), "an expert occupies two slots"
        assert np.array_equal(np.sort(self.slot_of[used]), np.flatnonzero(self.owner >= 0))
        assert (self.locks >= 0).all()
