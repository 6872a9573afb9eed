"""LFU with perfect counts: every access since the start counts, evicted entries keep theirs.

The victim is the resident entry with the lowest count, ties going to the least
recently used. Every miss is admitted.
"""

from __future__ import annotations

import heapq

from freetoken.sim.policies.base import Policy


class LFU(Policy):
    name = "lfu"

    def __init__(self, slots, num_layers, num_experts):
        super().__init__(slots, num_layers, num_experts)
        self._count: dict[int, int] = {}
        self._resident: dict[int, tuple[int, int]] = {}  # key -> (count, last access time)
        self._heap: list[tuple[int, int, int]] = []  # (count, time, key); stale entries skipped
        self._time = 0

    def access(self, key: int) -> bool:
        self._time += 1
        count = self._count.get(key, 0) + 1
        self._count[key] = count
        hit = key in self._resident
        if not hit:
            if not self.slots:
                return False
            if len(self._resident) >= self.slots:
                self._evict()
        stamp = (count, self._time)
        self._resident[key] = stamp
        heapq.heappush(self._heap, (count, self._time, key))
        if len(self._heap) > 4 * self.slots + 64:
            self._compact()
        return hit

    def _evict(self) -> None:
        while True:
            count, time, key = heapq.heappop(self._heap)
            if self._resident.get(key) == (count, time):
                del self._resident[key]
                return

    def _compact(self) -> None:
        self._heap = [(c, t, k) for k, (c, t) in self._resident.items()]
        heapq.heapify(self._heap)
