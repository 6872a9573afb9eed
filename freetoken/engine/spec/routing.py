"""How many distinct routed experts a forward touches: hung on every MoE layer's `on_route`
hook, it counts the union of the experts each layer's rows route to. The price of a verify
is driven by that union (k+1 positions touch far fewer than k+1 times one token's experts)."""
from __future__ import annotations

import torch

from ...layers.moe import SparseMoE


def moe_layers(model) -> list[SparseMoE]:
    """Every routed-expert layer of a loaded model (any family: they hang off `layers[i]`)."""
    found, seen = [], set()

    def walk(obj, depth):
        if id(obj) in seen or depth > 3:
            return
        seen.add(id(obj))
        if isinstance(obj, SparseMoE):
            found.append(obj)
            return
        for v in getattr(obj, "__dict__", {}).values():
            if isinstance(v, (list, tuple)):
                for x in v:
                    walk(x, depth + 1)
            elif hasattr(v, "__dict__") and not isinstance(v, (torch.Tensor, type)):
                walk(v, depth + 1)

    for layer in getattr(model, "layers", []):
        walk(layer, 0)
    return found


class RoutingObserver:
    """Counts, per forward, the distinct (layer, expert) pairs routed to."""

    def __init__(self, model):
        self.layers = moe_layers(model)
        self.top_k = self.layers[0].top_k if self.layers else 0
        self.unique = 0                   # distinct (layer, expert) pairs since `start()`
        self.rows = 0                     # routed rows of the first MoE layer since `start()`
        for m in self.layers:
            prev = m.on_route
            m.on_route = self._hook(prev)

    def _hook(self, prev):
        def on_route(layer, ids, w):
            # a decode step's few ids: a set is ~1 us where torch.unique is ~9 us (5 layers a step)
            self.unique += len(set(ids.reshape(-1).tolist())) if ids.numel() <= 64 else int(torch.unique(ids).numel())
            if self.rows == 0 or layer == self.layers[0].moe_layer:
                self.rows += ids.shape[0]
            if prev is not None:
                prev(layer, ids, w)
        return on_route

    def start(self) -> None:
        self.unique = self.rows = 0
