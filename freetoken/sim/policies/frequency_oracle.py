"""The best static placement in hindsight: pin, for the whole trace, the ``slots`` entries
the decode accesses most (count descending, then key). Offline, like ``belady``; it bounds
what any frequency-ranked policy (LFU, LRFU, hot placement) can reach without following
routing changes, which tells an unreachable miss-rate target from a weak policy."""

from __future__ import annotations

from collections import Counter

from freetoken.sim.access import AccessStream
from freetoken.sim.policies.base import Policy
from freetoken.sim.policies.hot_placement import hottest
from freetoken.sim.trace import DECODE


class FrequencyOracle(Policy):
    name = "static-oracle"

    def prepare(self, stream: AccessStream) -> None:
        counts = Counter(k for seg in stream.segments if seg.phase == DECODE for k in seg.keys())
        self._pinned = hottest(counts, self.slots, self.num_layers * self.num_experts)

    def access(self, key: int) -> bool:
        return key in self._pinned
