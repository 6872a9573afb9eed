"""Decode decisions on the device: one MoE layer's LRU cache decision as fixed-shape tensor ops.

The same decision as `decision.decide` + `planner.MissPlanner` + `slots.SlotTable` under
`lru` (tests/experts/test_device_plan.py replays recorded traces through both and gets the
same fills, victims and CPU sets), written so that nothing has to come back to the host: every
tensor has the shape P = T*K (the step's routed pairs) or N (slots), padded entries carry a
mask, and counts stay device scalars. The same code runs on CPU tensors in the tests.

  1. dedup: sort the P flat ids, mark first occurrences, rank = cumsum - 1; `uniq` [P] padded
     with a sentinel id whose residency entry is always -1; tokens per unique by scatter_add
  2. classify against the residency tensor `slot_of` [L*E+1]: hits (resident, landed),
     in flight (a background fill not landed: CPU), misses
  3. rank the misses as the planner does (most tokens, then demand, then id: three stable
     sorts) and take q* of them from the live B_P/B_H (`balanced_q` in float64 tensor ops, the
     clamp, the background fill and the exploration rule)
  4. victims in one pass: one sort of the slots by (empty first, then last use), locked hits
     and pending slots last; the first n_fill are the victims (the caller guarantees
     capacity >= P + 1, so one wave always suffices)
  5. commit: evict, map, stamp (fresh clock values in the host table's order: hits by id, then
     the fill or the background fill in rank order)
  6. rewrite routing ids: per pair the slot id where the device runs it, else -1, and the flat
     id where the CPU runs it, else -1 (hybrid copies only that [T, K] list to the host).

State moves to and from the host `SlotTable` / `MissPlanner` at phase changes (`load`/`store`):
prefill, resizes, statistics and the policies the device path does not express (lfu, lrfu,
arc, +prefetch) keep the host table as the source of truth.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .planner import MissPlanner
from .slots import SlotTable

_BIG = torch.iinfo(torch.int64).max


@dataclass
class DevicePlan:
    """One layer call's decision; every field a device tensor of fixed shape."""
    uniq: torch.Tensor        # [P] unique flat ids, ascending, padded with the sentinel
    n_uniq: torch.Tensor      # scalar
    hit: torch.Tensor         # [P] bool per unique
    fill: torch.Tensor        # [P] fill ids in rank order; valid where fill_mask
    fill_mask: torch.Tensor   # [P] bool
    victims: torch.Tensor     # [P] victim slot of each fill (distinct slots also where not valid)
    warm: torch.Tensor        # [P] bool per unique: the background fill (runs on the CPU now)
    warm_slot: torch.Tensor   # scalar: its victim
    on_cpu: torch.Tensor      # [P] bool per unique: run by the CPU branch (C, warm, in flight)
    slot_ids: torch.Tensor    # [T, K] slot of each pair the device runs, else -1
    cpu_ids: torch.Tensor     # [T, K] flat id of each pair the CPU runs, else -1
    counts: torch.Tensor      # [4]: hits, misses, fills, cpu experts (statistics)


class DeviceLRU:
    """The residency table, recency and planner demand as tensors on `device`."""

    def __init__(self, num_flat: int, slots: int, device: torch.device, explore_every: int = 16,
                 demand_halflife_steps: int = 64):
        self.num_flat, self.device = num_flat, torch.device(device)
        self.explore_every, self.halve_every = explore_every, demand_halflife_steps
        self.capacity = int(slots)
        dev = self.device
        self.slot_of = torch.full((num_flat + 1,), -1, dtype=torch.int64, device=dev)   # + sentinel
        self.demand = torch.zeros(num_flat + 1, dtype=torch.float32, device=dev)
        self.owner = torch.full((self.capacity,), -1, dtype=torch.int64, device=dev)
        self.stamp = torch.full((self.capacity,), -1, dtype=torch.int64, device=dev)
        self.pending = torch.zeros(self.capacity, dtype=torch.bool, device=dev)
        self.clock = torch.zeros((), dtype=torch.int64, device=dev)
        self.evictions = torch.zeros((), dtype=torch.int64, device=dev)
        self.calls = 0          # host: the planner's call counter (exploration), no data needed
        self.steps = 0

    # ---- host <-> device (phase changes; syncs allowed there) -------------------------------
    def load(self, table: SlotTable, planner: MissPlanner) -> None:
        """Take the host table's state (it must be at a safe point: nothing locked)."""
        if table.capacity != self.capacity:
            self.__init__(self.num_flat, table.capacity, self.device, self.explore_every, self.halve_every)
        dev = self.device
        self.slot_of[:-1].copy_(torch.from_numpy(table.slot_of).to(dev))
        self.owner.copy_(torch.from_numpy(table.owner).to(dev))
        self.stamp.copy_(torch.from_numpy(table.stamp).to(dev))
        self.pending.copy_(torch.from_numpy(table.pending).to(dev))
        self.clock.fill_(table.clock)
        self.evictions.fill_(table.evictions)
        self.demand[:-1].copy_(torch.from_numpy(planner.demand).to(dev))
        self.calls, self.steps = planner.calls, planner.steps

    def store(self, table: SlotTable, planner: MissPlanner) -> None:
        """Write the state back to the host table (one device->host copy of each tensor)."""
        table.slot_of[:] = self.slot_of[:-1].cpu().numpy()
        table.owner[:] = self.owner.cpu().numpy()
        table.stamp[:] = self.stamp.cpu().numpy()
        table.pending[:] = self.pending.cpu().numpy()
        table.clock = int(self.clock)
        table.evictions = int(self.evictions)
        planner.demand[:] = self.demand[:-1].cpu().numpy()
        planner.calls, planner.steps = self.calls, self.steps

    def end_step(self) -> None:
        self.steps += 1
        if self.steps % self.halve_every == 0:
            self.demand.mul_(0.5)

    def land(self) -> None:
        """Background fills have landed (the device path issues them on the compute stream)."""
        self.pending.zero_()

    # ---- one layer call ----------------------------------------------------------------------
    def plan(self, flat: torch.Tensor, policy: str, b_p: float, b_h: float, link_busy: bool = False) -> DevicePlan:
        """The decision for routing `flat` [T, K] (flat ids, device); policy "offload" | "hybrid".
        Commits it to the table (as decide + install + ready + release do on the host)."""
        if policy not in ("offload", "hybrid"):
            raise ValueError(f"device plan: policy offload|hybrid, got {policy!r}")
        T, K = flat.shape
        P, N, dev = T * K, self.capacity, self.device
        if N < P + 1:
            raise ValueError(f"device plan needs capacity >= {P + 1} slots for {P} routed pairs, has {N}")
        self.calls += 1
        ar = torch.arange(P, device=dev)
        # 1. dedup
        f = flat.reshape(-1).to(torch.int64)
        srt, perm = torch.sort(f, stable=True)
        first = torch.ones(P, dtype=torch.bool, device=dev)
        first[1:] = srt[1:] != srt[:-1]
        rank = torch.cumsum(first, 0) - 1
        n_uniq = first.sum()
        uniq = torch.full((P,), self.num_flat, dtype=torch.int64, device=dev).scatter(0, rank, srt)
        tokens = torch.zeros(P, dtype=torch.int64, device=dev).scatter_add(0, rank, torch.ones_like(rank))
        inv = torch.empty_like(rank).scatter_(0, perm, rank)          # pair -> unique index
        valid = ar < n_uniq
        # 2. classify
        slots_u = self.slot_of[uniq]
        resident = slots_u >= 0
        inflight = resident & self.pending[slots_u.clamp_min(0)] if N else resident
        hit = resident & ~inflight
        miss = valid & ~resident
        m = miss.sum()
        # 3. rank the misses: -tokens, then -demand, then id (uniq is ascending already)
        o1 = torch.sort(-self.demand[uniq], stable=True).indices
        o2 = o1[torch.sort(-tokens[o1], stable=True).indices]
        ranked = o2[torch.sort((~miss[o2]).to(torch.int8), stable=True).indices]   # misses first
        pos = torch.empty_like(ranked).scatter_(0, ranked, ar)         # rank of each unique
        n_fill, n_warm = self._split(m, policy, b_p, b_h, link_busy)
        fill_u = miss & (pos < n_fill)
        warm_u = miss & (pos < n_warm)                # n_warm is 0 or 1 (then n_fill is 0)
        # planner.record(uniq): every routed access counts (after the plan)
        self.demand.index_add_(0, uniq, valid.to(torch.float32))
        # hits: touched in ascending id order with fresh clock values, locked for this call
        hit_slots = torch.where(hit, slots_u, N)                       # N: no slot
        h_rank = torch.cumsum(hit, 0)                                  # 1.. over the hits
        n_hit = hit.sum()
        stamp_ext = torch.cat([self.stamp, self.stamp.new_zeros(1)])
        stamp_ext.scatter_(0, hit_slots, self.clock + h_rank)
        self.stamp.copy_(stamp_ext[:N])
        self.clock.add_(n_hit)
        locked = torch.zeros(N + 1, dtype=torch.bool, device=dev).scatter(0, hit_slots, True)[:N]
        # 4. victims: empty slots first (in order), then least recent; locked/pending never
        si = torch.arange(N, device=dev)
        key = torch.where(self.owner >= 0, self.stamp, si - N - 1)
        key = torch.where(locked | self.pending, _BIG, key)
        by_key = torch.sort(key, stable=True).indices                  # a permutation of the slots
        # fills in rank order, victims in victim order; pads get distinct slots beyond n_fill
        fill_ids = uniq[ranked]
        fill_mask = ar < n_fill
        victims = by_key[:P]
        # 5. commit: evict the victims' owners, map the fills (touch in fill order)
        self._assign(fill_ids, victims, fill_mask)
        warm_id = uniq[ranked[:1]]                    # [1]: a 0-d index would read it on the host
        warm_mask = (n_warm > 0).reshape(1)
        warm_slot = by_key[:1]
        self._assign(warm_id, warm_slot, warm_mask)
        self.pending.scatter_(0, warm_slot, warm_mask | self.pending[warm_slot])
        # 6. rewrite the routing
        dev_u = hit | fill_u
        slot_u = torch.where(hit, slots_u, -1)
        fill_slot = torch.full((P,), -1, dtype=torch.int64, device=dev).scatter(0, ranked, victims)
        slot_u = torch.where(fill_u, fill_slot, slot_u)
        on_cpu = valid & ~dev_u
        pair_u = inv.reshape(T, K)
        slot_ids = torch.where(dev_u[pair_u], slot_u[pair_u], -1)
        cpu_ids = torch.where(on_cpu[pair_u], flat.to(torch.int64), -1)
        counts = torch.stack([n_hit, m + inflight.sum(), fill_u.sum(), on_cpu.sum()])
        return DevicePlan(uniq, n_uniq, hit, fill_ids, fill_mask, victims, warm_u, warm_slot.reshape(()),
                          on_cpu, slot_ids, cpu_ids, counts)

    def _split(self, m: torch.Tensor, policy: str, b_p: float, b_h: float, link_busy: bool):
        """(fills, background fills) as device scalars: MissPlanner.plan for lru, in tensor ops."""
        zero = torch.zeros_like(m)
        if policy == "offload" or b_h <= 0 or b_p >= b_h:
            q = m
            raw = m
        else:
            md = m.to(torch.float64)
            x = md * b_p / b_h
            lo, hi = torch.floor(x), torch.ceil(x)
            cpu_rate = b_h - b_p
            cost = lambda q: torch.maximum(q / b_p, (md - q) / cpu_rate)   # noqa: E731
            raw = torch.where(cost(lo) <= cost(hi), lo, hi).to(torch.int64)
            q = torch.where(m > 0, raw.clamp_min(1), zero)     # no misses: nothing to fill
        if policy == "offload":
            return q, zero
        explore = self.explore_every and self.calls % self.explore_every == 0
        n_fill = torch.where((q == m) & (m >= 2), m - 1, q) if explore else q
        background = (raw == 0) & (m > 0)
        n_fill = torch.where(background, zero, n_fill)
        n_warm = torch.where(background, zero if link_busy else torch.ones_like(m), zero)
        return n_fill, n_warm

    def _assign(self, ids: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor) -> None:
        """SlotTable.assign for the masked (id, slot) pairs; slots distinct, ids distinct."""
        N = self.capacity
        old = self.owner[slots]
        gone = mask & (old >= 0)
        self.slot_of.scatter_(0, torch.where(gone, old, self.num_flat), torch.full_like(old, -1))
        self.slot_of[-1] = -1
        self.evictions.add_(gone.sum())
        tgt = torch.where(mask, slots, N)
        owner_ext = torch.cat([self.owner, self.owner.new_zeros(1)])
        self.owner.copy_(owner_ext.scatter(0, tgt, ids)[:N])
        self.slot_of.scatter_(0, torch.where(mask, ids, self.num_flat), slots)
        self.slot_of[-1] = -1
        stamp_ext = torch.cat([self.stamp, self.stamp.new_zeros(1)])
        self.stamp.copy_(stamp_ext.scatter(0, tgt, self.clock + torch.cumsum(mask, 0))[:N])
        self.clock.add_(mask.sum())

    def check_against(self, table: SlotTable) -> None:
        """Tests: the device state equals the host table's."""
        assert np.array_equal(self.slot_of[:-1].cpu().numpy(), table.slot_of)
        assert np.array_equal(self.owner.cpu().numpy(), table.owner)
