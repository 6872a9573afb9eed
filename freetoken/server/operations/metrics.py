"""Prometheus metrics. One registry per app, so several servers can live in one process."""
from __future__ import annotations

import collections
import itertools
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
RECENT_REQUESTS = 256      # finished requests the web page's per-request charts get (/api/stats)
_TPS_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000)


def flatten(stats: dict, prefix: str = "") -> dict[tuple[str, str | None], float]:
    """{"total": {"hits": 3}, "per_layer": [{"hits": 1}]} -> {("total_hits", None): 3,
    ("layer_hits", "0"): 1}; strings are skipped."""
    out: dict[tuple[str, str | None], float] = {}
    for k, v in stats.items():
        name = f"{prefix}{k}"
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            out[(name, None)] = float(v)
        elif isinstance(v, dict):
            out.update(flatten(v, name + "_"))
        elif isinstance(v, list):
            for i, item in enumerate(v):
                if isinstance(item, dict):
                    for (n, _), x in flatten(item).items():
                        out[(f"{prefix}layer_{n}" if k == "per_layer" else f"{name}_{n}", str(i))] = x
    return out


# engine statistics that only ever grow (totals since start): Prometheus counters, exposed as
# freetoken_engine_<name>_total, so rate() and increase() work on them
ENGINE_COUNTERS = {"prefix_hit_tokens", "prefix_miss_tokens", "prefix_evicted_blocks",
                   "prefix_evicted_checkpoints", "prefix_restored_checkpoints"}


class EngineStatsCollector:
    """Exports the engine's `expert_stats()` (expert-cache hits, misses, fills, CPU-run
    experts, bytes moved, ...) as freetoken_engine_<name>. The engine thread takes the
    snapshot (`snapshot()` returns its latest); this collector never touches the engine."""

    def __init__(self, snapshot):
        self.snapshot = snapshot

    def collect(self):
        families: dict[str, GaugeMetricFamily] = {}
        for (name, layer), v in sorted(flatten(self.snapshot() or {}).items(),
                                       key=lambda kv: (kv[0][0], int(kv[0][1] or -1))):
            metric = f"freetoken_engine_{name}"
            fam = families.get(metric)
            if fam is None:
                kind = CounterMetricFamily if name in ENGINE_COUNTERS else GaugeMetricFamily
                fam = families[metric] = kind(
                    metric, f"engine statistic {name}", labels=["layer"] if layer is not None else None)
            if layer is None:
                fam.add_metric([], v)
            else:
                fam.add_metric([layer], v)
        yield from families.values()


class Metrics:
    def __init__(self, engine_stats=None):
        self.registry = r = CollectorRegistry()
        self.ttft = Histogram("freetoken_time_to_first_token_seconds", "Time to first token",
                              buckets=_TTFT_BUCKETS, registry=r)
        self.decode_tps = Histogram("freetoken_decode_tokens_per_second",
                                    "Per-request decode speed", buckets=_TPS_BUCKETS, registry=r)
        self.e2e = Histogram("freetoken_request_duration_seconds", "Request duration",
                             buckets=_TTFT_BUCKETS, registry=r)
        self.prompt_tokens = Counter("freetoken_prompt_tokens", "Prompt tokens processed", registry=r)
        self.generation_tokens = Counter("freetoken_generation_tokens", "Tokens generated", registry=r)
        self.requests = Counter("freetoken_requests", "Finished requests",
                                ["endpoint", "finish_reason"], registry=r)
        self.http_errors = Counter("freetoken_http_errors", "Requests answered with an error",
                                   ["status"], registry=r)
        self.client_disconnects = Counter("freetoken_client_disconnects",
                                          "Clients that left before their reply was sent",
                                          registry=r)
        self.stalled = Counter("freetoken_stalled_clients", "Requests aborted because their client "
                               "stopped reading (serve --stall-timeout)", registry=r)
        self.conn_timeouts = Counter("freetoken_connections_timed_out", "Connections closed because "
                                     "the client sent nothing, or its headers or body too slowly "
                                     "(serve --idle-timeout-s/--header-timeout-s/--body-timeout-s)",
                                     ["phase"], registry=r)
        self.kv_blocks_total = Gauge("freetoken_kv_blocks_total", "KV cache blocks (usable)",
                                     registry=r)
        self.kv_blocks_in_use = Gauge("freetoken_kv_blocks_in_use", "KV cache blocks held by requests",
                                      registry=r)
        self.preemptions = Counter("freetoken_preemptions", "Requests preempted (KV full) and "
                                   "recomputed later", registry=r)
        self.kv_evictions = Gauge("freetoken_kv_evictions", "Cached KV blocks evicted (0 until the "
                                  "engine keeps a prefix cache)", registry=r)
        self.engine_failures = Counter("freetoken_engine_step_failures", "Engine steps that raised",
                                       registry=r)
        self.running = Gauge("freetoken_requests_running", "Requests in the engine", registry=r)
        self.waiting = Gauge("freetoken_requests_waiting", "Requests queued for the engine",
                             registry=r)
        self.memory_resizes = Counter("freetoken_memory_resizes", "Runtime resizes of a memory component "
                                      "(POST /admin/memory or the free-memory watcher)",
                                      ["component", "direction", "trigger"], registry=r)
        self.memory_bytes = Gauge("freetoken_memory_bytes", "Current size of each resizable memory "
                                  "component (expert_cache, kv_cache, the disk tier's host_cache; state_cache is "
                                  "its budget)",
                                  ["component"], registry=r)
        self.memory_pinned = Gauge("freetoken_memory_pinned_bytes", "Host bytes page-locked in place "
                                   "(the expert pool on CUDA; no copy)", registry=r)
        self.memory_free = Gauge("freetoken_memory_free_bytes", "Free memory the watcher last read",
                                 ["device"], registry=r)
        self.engine_stats: dict = {}
        r.register(EngineStatsCollector(lambda: self.engine_stats))
        self.recent: collections.deque = collections.deque(maxlen=RECENT_REQUESTS)
        self._seq = itertools.count(1)

    def record_request(self, endpoint: str, finish: str, prompt: int, cached: int, completion: int,
                       ttft: float | None, tps: float) -> None:
        """One finished request for the page's charts (the histograms above observe the same
        values); `seq` orders them."""
        self.recent.append({"seq": next(self._seq), "time": time.time(), "endpoint": endpoint,
                            "finish_reason": finish, "prompt_tokens": prompt, "cached_tokens": cached,
                            "completion_tokens": completion, "ttft_s": ttft, "decode_tps": tps})

    def record_resize(self, result: dict, sizes: dict) -> None:
        """One count per component a resize changed, and the new sizes."""
        for name, d in result.get("components", {}).items():
            if d is not None and d["before"] != d["after"]:
                direction = "grow" if d["after"] > d["before"] else "shrink"
                self.memory_resizes.labels(name, direction, result.get("trigger", "api")).inc()
        self.set_memory_sizes(sizes)

    def set_memory_sizes(self, sizes: dict) -> None:
        for name, s in sizes.items():
            if s is not None:
                self.memory_bytes.labels(name).set(s["bytes"])

    def render(self) -> bytes:
        return generate_latest(self.registry)
