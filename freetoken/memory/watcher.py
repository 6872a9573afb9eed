"""The free-memory watcher: gives memory back when other programs need it, takes it again when
they are done. Runs on the engine thread between steps (server/engine_loop.py).

Each device ("host": MemAvailable or the cgroup's room, probe.py; "cuda": mem_get_info) has
a floor and a ceiling (hysteresis):
  free < floor    shrink that device's components until free would be back at the ceiling:
                  expert cache first (speed only), then the disk tier's host cache (speed
                  only; it keeps one slot), then the checkpoint budget (prefix reuse), then KV
                  blocks no sequence holds (never a running request: no preemption)
  free > ceiling  grow components that are below the start-up plan back toward it, by at most
                  free - ceiling: KV first (room for requests), then checkpoints, then the
                  host cache, then the expert cache
Between floor and ceiling nothing happens, and two actions are at least `min_interval_s`
apart, so a program whose memory use wobbles around one threshold does not make the engine
resize every step. A grow never takes free memory below the ceiling, a shrink aims at the
ceiling, so one action does not trigger the opposite one.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from .probe import GiB, probe

SHRINK_ORDER = ("expert_cache", "host_cache", "state_cache", "kv_cache")
OPTION = {"expert_cache": "expert_cache_gib", "kv_cache": "kv_cache_gib", "state_cache": "state_cache_gib",
          "host_cache": "host_cache_gib"}


@dataclass(frozen=True)
class WatchPolicy:
    floor_bytes: int
    ceiling_bytes: int
    min_interval_s: float = 5.0
    poll_s: float = 1.0

    def __post_init__(self):
        if not 0 <= self.floor_bytes < self.ceiling_bytes:
            raise ValueError(f"memory watcher: expected 0 <= floor < ceiling, got floor {self.floor_bytes / GiB:.2f} "
                             f"GiB, ceiling {self.ceiling_bytes / GiB:.2f} GiB")

    @classmethod
    def from_gib(cls, floor_gib: float, ceiling_gib: float | None = None, min_interval_s: float = 5.0):
        ceiling = ceiling_gib if ceiling_gib is not None else floor_gib * 1.5 + 0.25
        return cls(int(floor_gib * GiB), int(ceiling * GiB), min_interval_s)


def machine_free(device_type: str = "cpu") -> dict[str, int]:
    """Free bytes per device kind, as the plan reads them."""
    m = probe(device_type)
    free = {"host": m.host_available}
    if m.device_free is not None:
        free["cuda"] = m.device_free
    return free


class MemoryWatcher:
    """`decide(sizes)` -> keyword arguments for `LLMEngine.resize_memory`, or None.
    sizes: component -> {"bytes": current, "device": "host" | "cuda" | "cpu", ...}
    (`LLMEngine.memory_sizes()`); `planned`: component -> bytes at start (the ceiling of growth)."""

    def __init__(self, policy: WatchPolicy, planned: dict[str, int], read_free: Callable[[], dict[str, int]],
                 clock: Callable[[], float] = time.monotonic):
        self.policy, self.planned, self.read_free, self.clock = policy, planned, read_free, clock
        self._last_action = -float("inf")
        self._last_poll = -float("inf")
        self.last_free: dict[str, int] = {}

    def poll(self, sizes_fn: Callable[[], dict]) -> dict | None:
        """Rate-limited `decide`: reads free memory at most every `poll_s` seconds."""
        now = self.clock()
        if now - self._last_poll < self.policy.poll_s or now - self._last_action < self.policy.min_interval_s:
            return None
        self._last_poll = now
        return self.decide(sizes_fn())

    def decide(self, sizes: dict) -> dict | None:
        now = self.clock()
        if now - self._last_action < self.policy.min_interval_s:
            return None
        free = self.read_free()
        self.last_free = dict(free)
        want: dict[str, int] = {}
        for dev, avail in free.items():
            mine = {c: s for c, s in sizes.items() if s is not None and _kind(s["device"]) == dev}
            if avail < self.policy.floor_bytes:
                need = self.policy.ceiling_bytes - avail
                for c in SHRINK_ORDER:
                    if need <= 0 or c not in mine:
                        continue
                    cur = _held(c, mine[c])
                    take = min(cur, need)
                    if take > 0:
                        want[c] = cur - take
                        need -= take
            elif avail > self.policy.ceiling_bytes:
                room = avail - self.policy.ceiling_bytes
                for c in reversed(SHRINK_ORDER):
                    if room <= 0 or c not in mine:
                        continue
                    cur = mine[c]["bytes"]
                    add = min(self.planned.get(c, 0) - cur, room)
                    if add > 0:
                        want[c] = cur + add
                        room -= add
        if not want:
            return None
        self._last_action = now
        out = {OPTION[c]: max(0, b) / GiB for c, b in want.items()}
        out["allow_preempt"] = False
        return out


def _kind(device: str) -> str:
    return "cuda" if device.startswith("cuda") else "host"


def _held(component: str, s: dict) -> int:
    """Bytes a shrink of this component can give back: the checkpoint budget frees only what
    checkpoints use; KV and expert banks are allocated in full."""
    return s.get("used_bytes", s["bytes"]) if component == "state_cache" else s["bytes"]
