"""The accelerator-side expert cache: N slots shared by every MoE layer.

Each slot holds one complete expert (a row of every bank, same bank keys as the pool; for a
grouped pool of several row widths, rows as wide as the widest group's, grouped_pool.py).
Residency, the replacement policy and the victims are the bank-less `SlotTable`
(`slots.py`, also what `freetoken sim` replays); this class adds the slot banks on
`device` and the copies that fill them. Control lives on the host; on a CPU-only machine
the banks are a separate host region, filled by real copies.

The pool is never touched except to read rows from it, so `resize` can rebuild the
slot banks at any safe point (no step in flight) keeping the most recent residents.
"""
from __future__ import annotations

import numpy as np
import torch

from .pool import ExpertPool
from .slots import DEFAULT_POLICY, SlotTable
from .transfer import CopyEngine, CopyJob, SyncCopyEngine


class ExpertCache:
    def __init__(self, pool: ExpertPool, slots: int, device: torch.device,
                 copy_engine: CopyEngine | None = None, policy: str = DEFAULT_POLICY):
        self.pool = pool
        self.device = torch.device(device)
        self.copy = copy_engine or SyncCopyEngine()
        self.table = SlotTable(pool.num_layers * pool.num_experts, pool.num_experts, int(slots), policy)
        self._landing: list[tuple[CopyJob, np.ndarray]] = []
        self._alloc()

    def _alloc(self) -> None:
        self.banks = {k: torch.empty((self.capacity, *shape), dtype=dtype, device=self.device)
                      for k, (shape, dtype) in self.pool.slot_rows().items()}

    # ---- the slot table's state, read by the planner, the backends and tests ---------------
    capacity = property(lambda self: self.table.capacity)
    slot_of = property(lambda self: self.table.slot_of)
    owner = property(lambda self: self.table.owner)
    stamp = property(lambda self: self.table.stamp)
    locks = property(lambda self: self.table.locks)
    pending = property(lambda self: self.table.pending)
    evictions = property(lambda self: self.table.evictions)
    resident = property(lambda self: self.table.resident)

    def lookup(self, flat_ids: np.ndarray) -> np.ndarray:
        return self.table.lookup(flat_ids)

    def touch(self, slots: np.ndarray) -> None:
        self.table.touch(slots)

    def lock(self, slots: np.ndarray) -> None:
        self.table.lock(slots)

    def unlock(self, slots: np.ndarray) -> None:
        self.table.unlock(slots)

    def lru_order(self) -> list[int]:
        return self.table.lru_order()

    def evictable(self) -> int:
        return self.table.evictable()

    def candidates(self, k: int, incoming: np.ndarray | None = None) -> np.ndarray:
        return self.table.candidates(k, incoming)

    # ---- fills ------------------------------------------------------------------------
    def install(self, flat_ids: np.ndarray, slots: np.ndarray, background: bool = False) -> CopyJob | None:
        """Evict the slots' owners, map flat_ids into them (locked, most recent) and start the
        copies. Sync fills: the caller waits on the job (`ready`). Background fills stay pending
        and locked until `poll` sees them land."""
        if len(flat_ids) == 0:
            return None
        self.table.assign(flat_ids, slots)
        pairs = self.pool.fill_pairs(self.banks, slots.tolist(), flat_ids.tolist())
        job = self.copy.submit(pairs, self.pool.flat_nbytes(flat_ids))     # real bytes, not the slots'
        if background:
            self._landing.append((job, slots))
        return job

    def ready(self, job: CopyJob | None, slots: np.ndarray) -> None:
        """Later device work reads the job's rows: make it wait for them."""
        if job is not None:
            self.copy.device_wait(job)
        self.table.ready(slots)

    def poll(self) -> list[CopyJob]:
        """Background fills that have landed become readable and evictable."""
        landed, still = [], []
        for job, slots in self._landing:
            if job.done():
                job.wait()
                self.table.ready(slots)
                self.table.unlock(slots)
                landed.append(job)
            else:
                still.append((job, slots))
        self._landing = still
        return landed

    def wait_all(self) -> None:
        """Wait for every background fill to land (the caller polls them)."""
        for job, _ in self._landing:
            job.wait()

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
        keep = self.table.keep_most_recent(int(slots))
        idx = torch.as_tensor(keep, dtype=torch.long, device=self.device)
        for k, old in list(self.banks.items()):            # one bank at a time: peak old + new of one
            new = torch.empty((self.capacity, *old.shape[1:]), dtype=old.dtype, device=self.device)
            torch.index_select(old, 0, idx, out=new[:len(keep)])   # survivors copied once, no temporary
            self.banks[k] = new
            del old

    def check(self) -> None:
        self.table.check()
