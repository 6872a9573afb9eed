"""Project decode tok/s of the engine's miss-split rules by replaying a trace.

The engine's cache is the global LRU (``cache_policy="lrfu"`` tries LRFU). Per decode cell (one layer of one token) the
hits refresh recency; of the ``m`` misses (ascending id) the first ``q`` are filled
into the cache and the rest run on the CPU without touching residency. Rules for q:

- ``all-fill``: q = m (plain offload);  ``all-cpu``: q = 0;
- ``fixed``: q = round(fraction * m);
- ``q*``: q = round(m * B_P / B_H) clamped to [1, m] (the engine's rule, issue 4);
- ``balanced``: q = round(m * B_P' / (B_P' + B_H')) with the concurrent bandwidths,
  so both branches finish together; no forced minimum fill;
- ``greedy-q``: per cell, the q in 0..m with the least layer time now (ties: more
  fills); greedy, it ignores what a fill saves later, so it is no upper bound.

q never exceeds the slots not holding this cell's hits. Prefill fills every routed
expert (the engine streams whole layers) and is not timed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources

from freetoken.sim.access import AccessStream
from freetoken.sim.engine_cache import ENGINE_CACHES
from freetoken.sim.hardware import Hardware
from freetoken.sim.split_time import layer_time
from freetoken.sim.trace import DECODE, Trace

SPLITS = ("all-fill", "all-cpu", "fixed", "q*", "balanced", "greedy-q")


def round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


def q_star(m: int, hw: Hardware) -> int:
    if m == 0:
        return 0
    return min(m, max(1, round_half_up(m * hw.link_gbps / hw.cpu_gbps)))


def q_balanced(m: int, hw: Hardware) -> int:
    link, cpu = hw.link_concurrent_gbps, hw.cpu_concurrent_gbps
    return round_half_up(m * link / (link + cpu))


@dataclass(frozen=True)
class Projection:
    split: str
    slots: int
    tokens: int
    seconds: float  # total decode time of the expert layers
    hits: int
    fills: int
    cpu: int

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else math.inf


def known_model_bytes(model: str) -> dict | None:
    table = json.loads(resources.files(__package__).joinpath("models.json").read_text())
    return table.get(model)


def project(
    stream: AccessStream,
    tokens: int,
    hw: Hardware,
    slots: int,
    split: str,
    expert_bytes: list[float],
    dense_bytes: list[float],
    fraction: float = 0.5,
    cache_policy: str = "lru",
) -> Projection:
    cache = ENGINE_CACHES[cache_policy](slots, stream.num_experts)
    seconds = 0.0
    hits_total = fills_total = cpu_total = 0
    for seg in stream.segments:
        if seg.phase != DECODE:
            for cell in seg.cells:
                for key in cell:
                    if not cache.lookup(key) and slots:
                        cache.fill(key)
            continue
        for cell, layer in zip(seg.cells, seg.layers):
            hits = [key for key in cell if cache.lookup(key)]
            misses = [key for key in cell if key not in hits]
            m = len(misses)
            b, d = expert_bytes[layer], dense_bytes[layer]
            room = max(0, slots - len(hits))
            if split == "all-fill":
                q = m
            elif split == "all-cpu":
                q = 0
            elif split == "fixed":
                q = round_half_up(fraction * m)
            elif split == "q*":
                q = q_star(m, hw)
            elif split == "balanced":
                q = q_balanced(m, hw)
            elif split == "greedy-q":
                q = min(range(min(m, room), -1, -1), key=lambda q: layer_time(len(hits), q, m - q, b, d, hw))
            else:
                raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
            q = min(q, room)
            protect = set(hits)
            for key in misses[:q]:
                cache.fill(key, protect)
                protect.add(key)
            seconds += layer_time(len(hits), q, m - q, b, d, hw)
            hits_total += len(hits)
            fills_total += q
            cpu_total += m - q
    return Projection(split, slots, tokens, seconds, hits_total, fills_total, cpu_total)


def model_bytes(trace: Trace, expert_bytes: float | None) -> tuple[list[float], list[float]]:
    """Per-layer (expert bytes, dense bytes): flag, then the trace's own record, then models.json."""
    L = trace.num_layers
    known = known_model_bytes(trace.model) or {}
    dense = trace.dense_bytes or [known.get("dense_bytes", 0)] * L
    if expert_bytes is not None:
        return [float(expert_bytes)] * L, [float(x) for x in dense]
    if trace.expert_bytes:
        return [float(x) for x in trace.expert_bytes], [float(x) for x in dense]
    if "expert_bytes" in known:
        return [float(known["expert_bytes"])] * L, [float(x) for x in dense]
    raise ValueError(f"{trace.name}: the trace records no expert size for model {trace.model!r}; pass --expert-bytes")


def best_fixed_fraction(stream, tokens, hw, slots, expert_bytes, dense_bytes, steps: int = 10, cache_policy: str = "lru") -> tuple[float, Projection]:
    """Sweep the fixed hybrid's fill fraction over 0, 1/steps, ..., 1; return the fastest."""
    runs = [
        (i / steps, project(stream, tokens, hw, slots, "fixed", expert_bytes, dense_bytes, i / steps, cache_policy))
        for i in range(steps + 1)
    ]
    return max(runs, key=lambda fr: fr[1].tokens_per_second)
