"""ARC (Megiddo & Modha, FAST 2003): adapts between recency (T1) and frequency (T2).

T1/T2 hold resident entries seen once / at least twice recently; B1/B2 are ghost lists
of their recent evictions; ``p`` is the adaptive target size of T1. A straight
transcription of the paper's algorithm, with the cache size ``c = slots``.
"""

from __future__ import annotations

from collections import OrderedDict

from freetoken.sim.policies.base import Policy


class ARC(Policy):
    name = "arc"

    def __init__(self, slots, num_layers, num_experts):
        super().__init__(slots, num_layers, num_experts)
        self.p = 0.0
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()

    def _replace(self, key: int) -> None:
        if self.t1 and (len(self.t1) > self.p or (key in self.b2 and len(self.t1) == self.p) or not self.t2):
            old, _ = self.t1.popitem(last=False)
            self.b1[old] = None
        else:
            old, _ = self.t2.popitem(last=False)
            self.b2[old] = None

    def access(self, key: int) -> bool:
        c = self.slots
        if c == 0:
            return False
        if key in self.t1:
            del self.t1[key]
            self.t2[key] = None
            return True
        if key in self.t2:
            self.t2.move_to_end(key)
            return True
        if key in self.b1:
            self.p = min(float(c), self.p + max(len(self.b2) / len(self.b1), 1.0))
            self._replace(key)
            del self.b1[key]
            self.t2[key] = None
            return False
        if key in self.b2:
            self.p = max(0.0, self.p - max(len(self.b1) / len(self.b2), 1.0))
            self._replace(key)
            del self.b2[key]
            self.t2[key] = None
            return False
        l1 = len(self.t1) + len(self.b1)
        total = l1 + len(self.t2) + len(self.b2)
        if l1 == c:
            if len(self.t1) < c:
                self.b1.popitem(last=False)
                self._replace(key)
            else:
                self.t1.popitem(last=False)
        elif l1 < c and total >= c:
            if total == 2 * c:
                self.b2.popitem(last=False)
            self._replace(key)
        self.t1[key] = None
        return False
