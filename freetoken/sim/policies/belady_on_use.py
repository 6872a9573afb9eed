"""The offline optimum of every *fetch-on-use* policy: an expert enters the cache only when a
token routes it (no prefetch, no placement ahead of use), a miss may bypass the cache (the
engine's CPU branch), and the cache persists across sequences (no free rearrangement).
Every replacement or admission rule the engine can run without a predictor lives in this
model, so a cell whose `belady-on-use` is not 15% below LRU cannot reach the target
without prediction.

The rule is Belady's with bypass, on every access (prefill accesses cost nothing but are
chances to admit): keep the entries whose next *decode* use comes first; on a miss, drop
whichever of the residents and the missed entry is used next furthest away.
"""

from __future__ import annotations

import heapq

from freetoken.sim.access import AccessStream
from freetoken.sim.policies.base import Policy
from freetoken.sim.policies.belady import furthest
from freetoken.sim.trace import DECODE

NEVER = float("inf")


class BeladyOnUse(Policy):
    name = "belady-on-use"

    def prepare(self, stream: AccessStream) -> None:
        seq = [(k, seg.phase == DECODE) for seg in stream.segments for cell in seg.cells for k in cell]
        self._next: list[float] = [NEVER] * len(seq)   # the next *decode* use after each access
        last: dict[int, int] = {}
        for i in range(len(seq) - 1, -1, -1):
            k, decode = seq[i]
            self._next[i] = last.get(k, NEVER)
            if decode:
                last[k] = i
        self._i = 0
        self._resident: dict[int, float] = {}
        self._heap: list[tuple[float, int]] = []

    def access(self, key: int) -> bool:
        nxt = self._next[self._i]
        self._i += 1
        resident = self._resident
        hit = key in resident
        if not hit:
            if nxt == NEVER or not self.slots:
                return False
            if len(resident) >= self.slots:
                far_key, far = self._furthest()
                if far <= nxt:
                    return False               # bypass: the missed entry is the one to drop
                del resident[far_key]
        if nxt == NEVER:
            del resident[key]                  # not needed again: its slot is free
        else:
            resident[key] = nxt
            heapq.heappush(self._heap, (-nxt, key))
        return hit

    def _furthest(self) -> tuple[int, float]:
        return furthest(self._heap, self._resident)
