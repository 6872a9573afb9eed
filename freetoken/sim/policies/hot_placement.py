"""KTransformers-style placement: after each prefill, pin the experts the prompt routed most.

Entries rank by prompt count (descending), then key (ascending); the top ``slots`` are
pinned. When the prompt touched fewer entries than there are slots, the remaining slots
take zero-count entries in key order (a real system fills its GPU memory too). The
placement is static during decode. Before any prompt it is the zero-count order.
"""

from __future__ import annotations

from collections import Counter

from freetoken.sim.policies.base import Policy


def hottest(prompt_counts: Counter, slots: int, universe: int) -> frozenset[int]:
    ranked = sorted(prompt_counts, key=lambda k: (-prompt_counts[k], k))[:slots]
    chosen = set(ranked)
    for key in range(universe):
        if len(chosen) >= slots:
            break
        chosen.add(key)
    return frozenset(chosen)


class HotPlacement(Policy):
    name = "hot-placement"

    def __init__(self, slots, num_layers, num_experts):
        super().__init__(slots, num_layers, num_experts)
        self._pinned: frozenset[int] = frozenset()

    def place(self, prompt_counts: Counter) -> None:
        self._pinned = hottest(prompt_counts, self.slots, self.num_layers * self.num_experts)

    def access(self, key: int) -> bool:
        return key in self._pinned
