"""`default+oracle-prefetch`: the default policy with a perfect next-layer guess, the bound of
every next-layer predictor under the default's eviction, admission and transfer budget.

After each decode cell, instead of the history predictor's guesses, the experts the next decode
cell (same sequence, the next layer) really routes and that are not resident are copied into the
table's victims, within the same '+budget' room, likeliest (here: all) first. A trace of routing
alone cannot replay the router lookahead (it needs the hidden states); this bounds what any guess
of the next layer, router or history, could do at the same copy budget.
"""

from __future__ import annotations

import numpy as np

from freetoken.experts.memory.slots import DEFAULT_POLICY
from freetoken.sim.access import AccessStream
from freetoken.sim.policies.slot_table import slot_policy
from freetoken.sim.trace import DECODE


class OraclePrefetch(slot_policy("default+oracle-prefetch", DEFAULT_POLICY)):
    def prepare(self, stream: AccessStream) -> None:
        self._next: list[tuple[int, ...]] = []     # per decode cell in replay order: the next one's keys
        for seg in stream.segments:
            if seg.phase == DECODE:
                self._next += [*seg.cells[1:], ()]
        self._i = 0

    def end_cell(self, cell: tuple[int, ...]) -> None:
        t, E = self.table, self.num_experts
        nxt, self._i = self._next[self._i], self._i + 1
        layer = cell[0] // E if cell else -2
        want, slots = t.claim_prefetch(np.asarray([k for k in nxt if k // E == layer + 1], np.int64))
        if len(want):
            t.assign(want, slots)
            t.ready(slots)
            t.unlock(slots)
