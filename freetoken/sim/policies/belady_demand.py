"""Classic demand-paging Belady (MIN): every miss is admitted, evicting the resident entry
whose next use (prefill or decode) is furthest away. The offline optimum *without bypass*,
shown beside `belady` (which may leave a miss out of the cache, as the engine's CPU branch
can) to tell how much of the gap only admission control can close."""

from __future__ import annotations

import heapq

from freetoken.sim.access import AccessStream
from freetoken.sim.policies.base import Policy

NEVER = float("inf")


class BeladyDemand(Policy):
    name = "belady-no-bypass"

    def prepare(self, stream: AccessStream) -> None:
        keys = [k for seg in stream.segments for cell in seg.cells for k in cell]
        self._next: list[float] = [NEVER] * len(keys)
        last: dict[int, int] = {}
        for i in range(len(keys) - 1, -1, -1):
            self._next[i] = last.get(keys[i], NEVER)
            last[keys[i]] = i
        self._i = 0
        self._resident: dict[int, float] = {}      # key -> its next use
        self._heap: list[tuple[float, int]] = []   # (-next use, key), stale entries skipped

    def access(self, key: int) -> bool:
        nxt = self._next[self._i]
        self._i += 1
        hit = key in self._resident
        if not hit:
            if not self.slots:
                return False
            while len(self._resident) >= self.slots:
                neg, victim = heapq.heappop(self._heap)
                if self._resident.get(victim) == -neg:
                    del self._resident[victim]
        self._resident[key] = nxt
        heapq.heappush(self._heap, (-nxt, key))
        return hit
