"""llama.cpp ``--n-cpu-moe``-style static split: the last layers' experts resident, the first never.

Whole layers are taken from the last one down; a remainder of ``slots % E`` fills the
next layer's lowest expert ids so that capacity is equal to the other policies'.
"""

from __future__ import annotations

from freetoken.sim.policies.base import Policy


class StaticSplit(Policy):
    name = "static-split"

    def __init__(self, slots, num_layers, num_experts):
        super().__init__(slots, num_layers, num_experts)
        universe = num_layers * num_experts
        by_rank = sorted(range(universe), key=lambda k: (-(k // num_experts), k % num_experts))
        self._resident = frozenset(by_rank[: min(slots, universe)])

    def access(self, key: int) -> bool:
        return key in self._resident
