"""Expert-memory counters, per MoE layer and in total (`llm.expert_stats()`)."""
from __future__ import annotations

import logging
import time

import numpy as np

log = logging.getLogger("freetoken.experts")

COUNTS = ("calls", "routed", "hits", "misses", "fills", "warm_fills", "prefetches", "cpu_experts",
          "bytes_copied", "cpu_bytes", "streamed_layers")
TIMES = ("fill_s", "cpu_s", "device_s", "wall_s")
# per (layer, expert): how often each expert ran from the cache, was filled, ran on the CPU
# (the web page's heat map; each sums over the experts to its per-layer count)
PER_EXPERT = ("hits", "fills", "cpu_experts")


class ExpertStats:
    def __init__(self, num_layers: int, backend: str, log_every_s: float = 60.0,
                 num_experts: int | None = None):
        self.backend = backend
        self.c = {k: np.zeros(num_layers, np.int64) for k in COUNTS}
        self.E = num_experts
        self.pe = {k: np.zeros((num_layers, num_experts), np.int64) for k in PER_EXPERT} if num_experts else {}
        self._pe_flat = {k: v.reshape(-1) for k, v in self.pe.items()}     # views: the same counters
        self.t = {k: np.zeros(num_layers, np.float64) for k in TIMES}
        self.q_sum = 0
        self.m_sum = 0
        self.steps = {"prefill": 0, "decode": 0}
        self.log_every_s = log_every_s
        self._last_log = time.monotonic()

    def add(self, layer: int, **vals) -> None:
        for k, v in vals.items():
            (self.c if k in self.c else self.t)[k][layer] += v

    def add_hit_call(self, layer: int, routed: int, n: int, expert_bytes: int, prefetches: int, dt: float) -> None:
        """`add` of a layer call whose `n` experts all hit and ran on the CPU (the disk tier at
        hits, issue 39): the same counters, without add's per-keyword look-ups."""
        c, t = self.c, self.t
        c["calls"][layer] += 1
        c["routed"][layer] += routed
        c["hits"][layer] += n
        c["cpu_experts"][layer] += n
        c["cpu_bytes"][layer] += n * expert_bytes
        if prefetches:
            c["prefetches"][layer] += prefetches
        t["cpu_s"][layer] += dt
        t["wall_s"][layer] += dt

    def add_cpu_call(self, layer: int, routed: int, n: int, expert_bytes: int, dt: float, calls: int = 1) -> None:
        """`add` of a layer call whose `n` distinct experts all ran on the CPU (the cpu backend's
        decode): the same counters, without add's per-keyword look-ups (`calls` such calls
        summed: experts/execution/decode_row.py's, taken when the counters are read)."""
        c, t = self.c, self.t
        c["calls"][layer] += calls
        c["routed"][layer] += routed
        c["misses"][layer] += n
        c["cpu_experts"][layer] += n
        c["cpu_bytes"][layer] += n * expert_bytes
        t["cpu_s"][layer] += dt
        t["wall_s"][layer] += dt

    def add_experts(self, key: str, flat_ids) -> None:
        """One count for each expert of `flat_ids` (layer * E + expert, each at most once)."""
        if not self.pe or not len(flat_ids):
            return
        if isinstance(flat_ids, list) and len(flat_ids) <= 64:     # a decode call's few: no array round trip
            flat = self._pe_flat[key]
            for i in flat_ids:
                flat[i] += 1
        else:
            self.pe[key].reshape(-1)[np.asarray(flat_ids, np.int64)] += 1     # distinct: no np.add.at (~10x slower)

    def add_expert_counts(self, key: str, counts: np.ndarray) -> None:
        """Counts per flat id ([L * E]) gathered elsewhere (the device path's counters)."""
        if self.pe:
            self.pe[key] += np.asarray(counts, np.int64).reshape(self.pe[key].shape)

    def step(self, phase: str) -> None:
        self.steps[phase] = self.steps.get(phase, 0) + 1
        now = time.monotonic()
        if self.log_every_s and now - self._last_log >= self.log_every_s:
            self._last_log = now
            tot = self.totals()
            log.info("experts[%s]: hit rate %.1f%%, %d fills, %d cpu, %.2f GB copied, %.2f GB read by cpu",
                     self.backend, 100 * tot["hit_rate"], tot["fills"], tot["cpu_experts"],
                     tot["bytes_copied"] / 1e9, tot["cpu_bytes"] / 1e9)

    def totals(self) -> dict:
        out = {k: int(v.sum()) for k, v in self.c.items()}
        out.update({k: float(v.sum()) for k, v in self.t.items()})
        looked = out["hits"] + out["misses"]
        out["hit_rate"] = out["hits"] / looked if looked else 0.0
        out["mean_q"] = self.q_sum / max(1, self.c["calls"].sum())
        out["fill_fraction"] = self.q_sum / self.m_sum if self.m_sum else 0.0
        return out

    def as_dict(self, **extra) -> dict:
        per_layer = [{**{k: int(v[i]) for k, v in self.c.items()}, **{k: float(v[i]) for k, v in self.t.items()}}
                     for i in range(len(self.c["calls"]))]
        out = {"backend": self.backend, "steps": dict(self.steps), "total": self.totals(),
               "per_layer": per_layer, **extra}
        if self.pe:    # lists of lists: /metrics (server/operations/metrics.flatten) leaves them out
            out["per_expert"] = {k: v.tolist() for k, v in self.pe.items()}
        return out

    def reset(self) -> None:
        for v in (*self.c.values(), *self.t.values(), *self.pe.values()):
            v[:] = 0
        self.q_sum = self.m_sum = 0


# SlotTable.describe(); the last four only with '+budget' (experts/memory/prefetch_budget.py)
POLICY_KEYS = ("policy", "layer_aware", "admission", "prompt_weighted", "prefetch", "path_hops", "layer_ordered",
               "prefetch_used", "prefetch_wasted", "transfers", "transfer_budget")


def tier_summary(stats: dict | None) -> dict:
    """The expert memory tier by tier from `expert_stats()`: the device slot cache (size, hit
    rate), the host expert cache of the disk tier (size, hit rate, evictions) and the disk
    (reads, bytes, rate); a tier the backend does not have is absent."""
    stats = stats or {}
    backend, tot, out = stats.get("backend"), stats.get("total") or {}, {}
    if not backend:
        return out
    out["backend"] = backend
    cache = stats.get("cache")
    if cache and backend not in ("disk", "cpu"):
        out["device_cache"] = {"slots": cache.get("slots", 0), "gib": cache.get("gib", 0.0),
                               "hit_rate": tot.get("hit_rate", 0.0), "fills": tot.get("fills", 0),
                               **{k: cache[k] for k in POLICY_KEYS if k in cache}}
    hc = stats.get("host_cache")
    if hc:
        out["host_cache"] = {k: hc.get(k, 0) for k in ("slots", "resident", "gib", "hit_rate", "hits", "misses",
                                                         "prefetches", "evictions")}
        out["host_cache"].update({k: hc[k] for k in (*POLICY_KEYS, "prefetch_hit_rate", "prefetch_wasted_bytes")
                                  if k in hc})
    disk = stats.get("disk")
    if disk:
        out["disk"] = {k: disk.get(k, 0) for k in ("reads", "bytes_read", "read_s", "read_gbs", "errors", "pool_gib",
                                                   "b_d_gbs", "prefetch_cut", "handoffs", "file_changes", "checksum_mismatches")}
        out["disk"].update({k: disk[k] for k in ("integrity", "integrity_detail", "io") if k in disk})
    if stats.get("lookahead"):      # the disk tier's next-layer guesses (experts/disk/lookahead.py)
        out["lookahead"] = dict(stats["lookahead"])
    return out
