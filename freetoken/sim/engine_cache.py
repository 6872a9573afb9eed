"""The engine's expert cache as the projection drives it: look up, then fill chosen misses.

Unlike a replay policy, a miss is not admitted by itself: the split rule decides which
misses are filled, and the rest run on the CPU without touching residency. ``protect``
holds the current cell's hits and fills, which its later fills must not evict. A key is
filled only after it was looked up (and missed) in the same cell.
"""

from __future__ import annotations

from collections import OrderedDict

from freetoken.sim.policies.lrfu import HALF_LIFE_TOKENS, DecayedCounts


class LRUSlots:
    def __init__(self, slots: int, num_experts: int):
        self.slots = slots
        self._order: OrderedDict[int, None] = OrderedDict()

    def lookup(self, key: int) -> bool:
        if key in self._order:
            self._order.move_to_end(key)
            return True
        return False

    def fill(self, key: int, protect=()) -> None:
        if len(self._order) >= self.slots:
            victim = next(k for k in self._order if k not in protect)
            del self._order[victim]
        self._order[key] = None


class LRFUSlots:
    def __init__(self, slots: int, num_experts: int, half_life: float = HALF_LIFE_TOKENS):
        self.slots = slots
        self._counts = DecayedCounts(num_experts, half_life)

    def lookup(self, key: int) -> bool:
        self._counts.record(key)  # every routed access counts, hit or not
        return key in self._counts.resident

    def fill(self, key: int, protect=()) -> None:
        if len(self._counts.resident) >= self.slots:
            self._counts.evict(protect)
        self._counts.push(key)


ENGINE_CACHES = {"lru": LRUSlots, "lrfu": LRFUSlots}
