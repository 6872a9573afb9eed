"""Belady's offline optimum for the decode miss count: the bound no policy can beat.

The model every policy here lives in: an access to a resident entry is a hit; a decode
access to any other entry is a miss, after which the entry may be admitted (evicting
one) or not (as the static placements, and the engine's CPU branch, do); at the start
and after every prefill, placements may be rearranged for free (prefill misses are
not counted). The optimum in that model:
- after each such point, hold the ``slots`` entries whose next decode use comes first;
- on a decode miss, among the residents and the missed entry, drop the one whose next
  decode use (before the next free point) is furthest; that may be the missed entry.
Classic demand-paging Belady is not a bound here: a static placement can beat it.
"""

from __future__ import annotations

import heapq
from collections import Counter

from freetoken.sim.access import AccessStream
from freetoken.sim.policies.base import Policy
from freetoken.sim.trace import DECODE

NEVER = float("inf")


def decode_runs(stream: AccessStream) -> list[list[int]]:
    """Decode keys between free points (trace start, end of each prefill)."""
    runs: list[list[int]] = [[]]
    for seg in stream.segments:
        if seg.phase == DECODE:
            runs[-1].extend(seg.keys())
        else:
            runs.append([])
    return runs


def next_uses(keys: list[int]) -> list[float]:
    nxt: list[float] = [NEVER] * len(keys)
    last: dict[int, int] = {}
    for i in range(len(keys) - 1, -1, -1):
        nxt[i] = last.get(keys[i], NEVER)
        last[keys[i]] = i
    return nxt


def furthest(heap: list, resident: dict) -> tuple[int, float]:
    """The resident key whose next use is furthest away, from a max-heap of (-next use, key)
    whose stale entries (key gone or its next use moved) are dropped lazily."""
    while True:
        neg, key = heap[0]
        if resident.get(key) == -neg:
            return key, -neg
        heapq.heappop(heap)


class Belady(Policy):
    name = "belady"

    def prepare(self, stream: AccessStream) -> None:
        self._runs = decode_runs(stream)
        self._run = -1
        self._resident: dict[int, float] = {}

    def place(self, prompt_counts: Counter) -> None:
        self._run += 1
        keys = self._runs[self._run]
        self._next = next_uses(keys)
        self._pos = 0
        first: dict[int, int] = {}
        for i, k in enumerate(keys):
            if len(first) >= self.slots:
                break
            first.setdefault(k, i)
        self._resident = {k: float(i) for k, i in first.items()}
        self._heap = [(-i, k) for k, i in self._resident.items()]
        heapq.heapify(self._heap)

    def prefill_access(self, key: int) -> bool:
        return key in self._resident  # free: the placement is redone when the prefill ends

    def access(self, key: int) -> bool:
        resident = self._resident
        nxt = self._next[self._pos]
        self._pos += 1
        if key in resident:
            self._set(key, nxt)
            return True
        if nxt == NEVER or not self.slots:
            return False
        if len(resident) < self.slots:
            self._set(key, nxt)
            return False
        far_key, far = self._furthest()
        if far > nxt:
            del resident[far_key]
            self._set(key, nxt)
        return False

    def _set(self, key: int, nxt: float) -> None:
        if nxt == NEVER:
            self._resident.pop(key, None)  # never used again before the next free point
            return
        self._resident[key] = nxt
        heapq.heappush(self._heap, (-nxt, key))

    def _furthest(self) -> tuple[int, float]:
        return furthest(self._heap, self._resident)
