"""The decode layer of `offload` / `hybrid` with the decision on the device (issue 23, item 1).

Per MoE layer, no host synchronisation in `offload` and exactly one small device->host copy in
`hybrid`:
  1. `DeviceLRU.plan`: dedup, classify, q*, victims, rewritten routing (device_plan.py)
  2. fills: the device gathers the fills' pool rows into their victim slots (uva.py), masked,
     fixed shape (the padding rereads the first fill's row and rewrites each pad slot as is)
  3. hybrid: the CPU work list, the activations and the gate weights leave in ONE packed
     float64 copy [T, 2K + H] (into a pinned buffer with an event on CUDA), started before
     the device work; the host waits only for that copy, runs the CPU branch while the device
     computes, and adds its float32 sum
  4. the device experts: `torch_exec.run_slots` over the slot banks (gather by slot id, bmm)
Statistics stay on the device ([L, 4] counters) until `stats()` asks.
Used where it applies: lru (with or without +admit, which lru never uses), no +prefetch, no
fixed q, capacity >= T*K + 1 (one wave); elsewhere the host planner runs. Any format: ggml
slots hold the file's packed bytes, dequantized after the gather by the types the slots carry
(ggml_slots.py); a grouped pool (layers of different row widths) fills the front of each slot
row from its own group's rows. The engine picks it on CUDA; tests force it on the CPU (`device_decisions=True`).
"""
from __future__ import annotations

import numpy as np
import torch

from ..memory.device_plan import DeviceLRU
from .. import ggml_slots
from .torch_exec import run_slots
from ..memory.uva import device_rows

# host-list conversions of this path, counted (tests/experts/test_host_syncs.py)
HOST_COPIES = {"n": 0}


def applies(table, planner, spec) -> bool:
    """Whether the device decision can stand for the host planner of this cache."""
    return table.policy == "lru" and table.predictor is None and planner.fixed_q is None


class DeviceDecisions:
    def __init__(self, cache, planner, num_layers: int):
        self.cache, self.planner = cache, planner
        self.pool, self.device = cache.pool, cache.device
        self.lru = DeviceLRU(self.pool.num_layers * self.pool.num_experts, cache.capacity, self.device,
                             planner.explore_every, planner.halve_every)
        self.counts = torch.zeros(num_layers, 4, dtype=torch.int64, device=self.device)
        # per flat id (+ the sentinel, where padding lands): hits, fills, CPU runs (heat map)
        self.per_expert = torch.zeros(3, self.lru.num_flat + 1, dtype=torch.int64, device=self.device)
        self.active = False                       # the device state is the truth
        self._src = None
        self._pinned = None
        self.types = ggml_slots.pool_types(self.pool)     # ggml: the types per half, read once here
        n = self.pool.num_layers * self.pool.num_experts
        grouped = len(self.pool.groups) > 1               # per flat id: its group, its id there
        self._group_of = (torch.from_numpy(self.pool.group_of) if grouped else torch.zeros(n, dtype=torch.int64)).to(self.device)
        self._local_of = (torch.from_numpy(self.pool.local_of) if grouped else torch.arange(n)).to(self.device)

    # ---- whose state is the truth -------------------------------------------------------------
    def take(self) -> None:
        """Host -> device at a safe point (no fill in flight)."""
        if self.active:
            return
        self.cache.drain()
        self.lru.load(self.cache.table, self.planner)
        if self._src is None:
            self._src = [{k: device_rows(b, self.device) for k, b in g.banks.items()} for g in self.pool.groups]
        self.active = True

    def give_back(self) -> tuple[list[list[int]], np.ndarray] | None:
        """Device -> host (prefill, resize, stats, another policy): the table and the counters."""
        if not self.active:
            return None
        self.lru.land()
        self.lru.store(self.cache.table, self.planner)
        self.active = False
        return self.fold_counts()

    def fold_counts(self) -> tuple[list[list[int]], np.ndarray]:
        """([L][hits, misses, fills, cpu], [3, L * E] hits/fills/CPU runs per expert), zeroed."""
        c = self.counts.cpu().tolist()
        pe = self.per_expert[:, :-1].cpu().numpy().copy()     # (a view on a CPU device)
        self.counts.zero_()
        self.per_expert.zero_()
        return c, pe

    # ---- one layer ----------------------------------------------------------------------------
    def forward(self, layer: int, hidden: torch.Tensor, topk_ids: torch.Tensor, weights: torch.Tensor,
                policy: str, b_p: float, b_h: float, cpu_branch):
        """-> (float32 [T, H] output, host CPU-branch seconds, CPU experts run)."""
        T, K = topk_ids.shape
        H = hidden.shape[1]
        self.lru.land()                           # the previous call's background fills are in
        flat = topk_ids.to(torch.int64) + layer * self.pool.num_experts
        p = self.lru.plan(flat, policy, b_p, b_h)
        packed = None
        if policy == "hybrid":                    # the one device->host copy, started first
            packed = self._to_host(torch.cat([p.cpu_ids.to(torch.float64), weights.to(torch.float64),
                                              hidden.to(torch.float64)], 1))
        self._fill(p.fill, p.fill_mask, p.victims)
        self._fill(p.uniq[p.warm.to(torch.int64).argmax().reshape(1)], p.warm.any().reshape(1), p.warm_slot.reshape(1))
        per_choice = torch.zeros(T, K, H, dtype=torch.float32, device=hidden.device)
        run_slots(self.cache.banks, self.pool.spec, p.slot_ids, hidden, weights, per_choice, types=self.types)
        out = per_choice.sum(1)
        self.counts[layer].add_(p.counts)
        self._count_experts(p)
        cpu_s, n_cpu = 0.0, 0
        if packed is not None:
            host = self._wait(packed)
            ids = host[:, :K].numpy().astype(np.int64)       # host data from here on: numpy
            if (ids >= 0).any():
                # the CPU branch on its worker thread, as in the host path
                fut = cpu_branch.submit(host[:, 2 * K:].to(hidden.dtype), ids, host[:, K:2 * K].to(torch.float32))
                n_cpu = len(np.unique(ids[ids >= 0]))
                cpu_out, cpu_s = fut.result()
                out.add_(cpu_out.to(out.device))
        return out, cpu_s, n_cpu

    def _count_experts(self, p) -> None:
        """Per-expert counters, on the device (no sync): masked-out entries land on the sentinel."""
        pad = self.lru.num_flat
        for row, ids, mask in ((0, p.uniq, p.hit), (1, p.fill, p.fill_mask), (2, p.uniq, p.on_cpu)):
            self.per_expert[row].index_add_(0, torch.where(mask, ids, pad), mask.to(torch.int64))

    def _fill(self, ids: torch.Tensor, mask: torch.Tensor, slots: torch.Tensor) -> None:
        """bank[slots[i]] = pool[ids[i]] where mask[i]; other slots rewritten as they are. A
        grouped pool: each group's experts fill the front of each slot row (their own bytes)."""
        n = self.pool.num_layers * self.pool.num_experts
        src_idx = torch.where(mask, ids, ids[:1]).clamp(0, n - 1)
        group, local = self._group_of[src_idx], self._local_of[src_idx]
        for gi, src in enumerate(self._src):
            m = mask & (group == gi)
            at = torch.where(m, local, 0)
            for k, bank in self.cache.banks.items():
                dst = bank.view(torch.uint8) if bank.dtype != torch.uint8 else bank   # [cap, ..., row bytes]
                rows = src[k].index_select(0, at.to(src[k].device)).to(dst.device, non_blocking=True)
                rows = rows.reshape(rows.shape[0], *dst.shape[1:-1], -1)
                front = dst[..., :rows.shape[-1]]
                keep = m.reshape(-1, *([1] * (rows.dim() - 1)))
                front.index_copy_(0, slots, torch.where(keep, rows, front.index_select(0, slots)))

    def _to_host(self, t: torch.Tensor):
        HOST_COPIES["n"] += 1
        if t.device.type == "cpu":
            return t
        if self._pinned is None or self._pinned.shape != t.shape:
            self._pinned = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        self._pinned.copy_(t, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        return self._pinned, ev

    @staticmethod
    def _wait(packed):
        if isinstance(packed, tuple):
            buf, ev = packed
            ev.synchronize()
            return buf
        return packed
