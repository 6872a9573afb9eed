"""Global LRU over all layers: FreeToken's expert cache."""

from __future__ import annotations

from collections import OrderedDict

from freetoken.sim.policies.base import Policy


class GlobalLRU(Policy):
    name = "lru"

    def __init__(self, slots, num_layers, num_experts):
        super().__init__(slots, num_layers, num_experts)
        self._order: OrderedDict[int, None] = OrderedDict()

    def access(self, key: int) -> bool:
        order = self._order
        if key in order:
            order.move_to_end(key)
            return True
        if self.slots:
            if len(order) >= self.slots:
                order.popitem(last=False)
            order[key] = None
        return False
