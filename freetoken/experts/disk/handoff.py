"""A layer call's slots handed to the next layer's reads as soon as their experts have run.

When a decode step's experts do not fit the host cache (the 5% case of issue 39), the next
layer's read-ahead goes into slots of the layer just run (layer-aware eviction: used furthest
ahead). Released only at the end of the call, those reads had only the next layer's attention
to land in, and the next layer waited on most of them. So the call's victims -- the experts of
this call the policy gives up first (`HostExpertCache.victims_among`) -- run first, their slots
are released at once and the read-ahead starts into them while the call's other experts
compute. Which experts are read and which slots they take are the same as before; only when.
The outputs do not change: the call runs in pair rows added in flat-id order at the end
(backend's `_run_as_landed`), whatever the grouping. Off by default (`backend.HANDOFF`: on this
2-core box the reads' CPU then competes with the kernels; docs/benchmarks.md "Host tier at a 5%
cache").
"""
from __future__ import annotations

import numpy as np

# victims run (and released) at most this many per kernel call: each extra call costs ~0.05 ms of
# Python and a pool hand-off; each group's reads start that much of the call earlier (not tuned:
# 2, 4 and 8 could not be told apart under load)
GROUP = 2


class Handoff:
    """The early release of one layer call (`ids` ascending, their locked `slots`)."""

    def __init__(self, cache, ids: np.ndarray, slots: np.ndarray, nxt: np.ndarray, give: np.ndarray):
        self.cache, self.slots, self.nxt = cache, slots, nxt
        self.give = np.zeros(len(ids), bool)       # given up as soon as they have run
        self.give[give] = True
        self.done = np.zeros(len(ids), bool)       # released already
        self.started = 0                           # read-ahead started (into the released slots, first)

    @classmethod
    def plan(cls, cache, ids: np.ndarray, slots: np.ndarray, nxt: np.ndarray) -> "Handoff | None":
        """A handoff where the read-ahead `nxt` needs slots and the step's experts do not fit the
        cache (then its victims are this layer's: `victims_among`); None otherwise."""
        if not len(nxt) or len(ids) < 2 or not cache.over_capacity():
            return None
        want = int((cache.table.slot_of[nxt] < 0).sum())
        if want == 0 or want >= len(ids):
            return None
        return cls(cache, ids, slots, nxt, cache.victims_among(slots, want))

    def first(self, ready: np.ndarray) -> np.ndarray:
        """Of the experts `ready` to run (a mask over ids), those to run now: up to `GROUP` of the
        victims not yet released, where there are others besides (they run alone, so their slots
        free first: a call that gives up most of its slots starts its first reads early too)."""
        mine = ready & self.give & ~self.done
        if not mine.any():
            return ready
        pos = np.flatnonzero(mine)
        if len(pos) > GROUP:
            mine[pos[GROUP:]] = False
        return mine if (ready & ~mine).any() else ready

    def ran(self, idx: np.ndarray) -> None:
        """ids[idx] have run: the victims among them are released and the read-ahead started."""
        sel = idx[self.give[idx] & ~self.done[idx]]
        if len(sel):
            self.cache.release(self.slots[sel])
            self.done[sel] = True
            # as many reads as slots given up: more would take the slots of layers needed sooner
            # than this one's (still locked) experts, the ones the policy would give up
            want = self.nxt[self.cache.table.slot_of[self.nxt] < 0][:len(sel)]
            self.started += self.cache.prefetch(want) if len(want) else 0

    def rest(self) -> np.ndarray:
        """The slots still locked (the caller releases them)."""
        return self.slots[~self.done]
