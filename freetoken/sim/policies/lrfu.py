"""LRFU (Lee et al., 2001): evict the entry with the least exponentially decayed access count.

Each access adds 1 to an entry's score; scores halve every ``half_life`` tokens, where a
token is one pass through the layer stack (time ticks whenever the accessed layer is
lower than the previous one). A short half-life behaves like LRU, an infinite one like
LFU. Score ordering at the current time equals ordering by ``log(score) + rate * token``
of the entry's last access, which does not change between accesses, so a lazily cleaned
heap finds the victim. Ties go to the least recently used. Every miss is admitted.
"""

from __future__ import annotations

import heapq
import math

from freetoken.sim.policies.base import Policy

HALF_LIFE_TOKENS = 32.0


class DecayedCounts:
    """Decayed access counts of every key ever seen, and a min-heap of the resident ones."""

    def __init__(self, num_experts: int, half_life: float):
        self.num_experts = num_experts
        self.rate = math.log(2) / half_life
        self.token = 0
        self.last_layer = -1
        self.time = 0
        self.score: dict[int, tuple[float, int]] = {}  # key -> (score at its last access, token then)
        self.resident: dict[int, tuple[float, int]] = {}  # key -> its live heap entry (priority, time)
        self.heap: list[tuple[float, int, int]] = []

    def record(self, key: int) -> None:
        layer = key // self.num_experts
        if layer < self.last_layer:
            self.token += 1
        self.last_layer = layer
        self.time += 1
        score, token = self.score.get(key, (0.0, self.token))
        self.score[key] = (score * math.exp(-self.rate * (self.token - token)) + 1.0, self.token)
        if key in self.resident:
            self.push(key)

    def priority(self, key: int) -> float:
        score, token = self.score[key]
        return math.log(score) + self.rate * token

    def push(self, key: int) -> None:
        entry = (self.priority(key), self.time)
        self.resident[key] = entry
        heapq.heappush(self.heap, (*entry, key))
        if len(self.heap) > 4 * len(self.resident) + 64:
            self.heap = [(p, t, k) for k, (p, t) in self.resident.items()]
            heapq.heapify(self.heap)

    def evict(self, protect=()) -> None:
        """Drop the resident key of least priority that is not in ``protect``."""
        kept = []
        while True:
            priority, time, key = heapq.heappop(self.heap)
            if self.resident.get(key) != (priority, time):
                continue
            if key in protect:
                kept.append((priority, time, key))
                continue
            del self.resident[key]
            for entry in kept:
                heapq.heappush(self.heap, entry)
            return


class LRFU(Policy):
    name = "lrfu"
    half_life = HALF_LIFE_TOKENS

    def __init__(self, slots, num_layers, num_experts):
        super().__init__(slots, num_layers, num_experts)
        self.counts = DecayedCounts(num_experts, self.half_life)

    def priority(self, key: int) -> float:
        return self.counts.priority(key)

    def access(self, key: int) -> bool:
        counts = self.counts
        counts.record(key)
        if key in counts.resident:
            return True
        if self.slots:
            if len(counts.resident) >= self.slots:
                counts.evict()
            counts.push(key)
        return False
