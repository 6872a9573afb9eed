"""One LRU per layer, each with an equal share of the slots (the first ``slots % L`` layers get one more)."""

from __future__ import annotations

from collections import OrderedDict

from freetoken.sim.policies.base import Policy


def layer_shares(slots: int, num_layers: int) -> list[int]:
    base, extra = divmod(slots, num_layers)
    return [base + (1 if layer < extra else 0) for layer in range(num_layers)]


class PerLayerLRU(Policy):
    name = "per-layer-lru"

    def __init__(self, slots, num_layers, num_experts):
        super().__init__(slots, num_layers, num_experts)
        self._shares = layer_shares(slots, num_layers)
        self._orders: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_layers)]

    def access(self, key: int) -> bool:
        layer = key // self.num_experts
        order = self._orders[layer]
        if key in order:
            order.move_to_end(key)
            return True
        share = self._shares[layer]
        if share:
            if len(order) >= share:
                order.popitem(last=False)
            order[key] = None
        return False
