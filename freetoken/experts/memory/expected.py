"""Experts a step is expected to route, told ahead (speculative decoding's drafts: the verify's
positions are known tokens, and the routing those tokens had before says which experts the
verify will need), and what bringing them closer bought.

A backend with a cache takes layer l's expected experts once layer l-1 is done (layer 0's when
the step begins), while the attention in between runs, and starts background copies of those
not resident, as its own next-layer prefetch does. When layer l is routed, each started one
is counted used (routed) or wasted (not). Outputs never change: only residency does."""
from __future__ import annotations

import numpy as np


class ExpectedExperts:
    def __init__(self):
        self.want: dict[int, np.ndarray] = {}        # layer -> expected ids within the layer
        self.started: dict[int, np.ndarray] = {}     # layer -> ids whose copies were started for it
        self.c = dict(steps=0, prefetched=0, used=0, wasted=0)

    def expect(self, per_layer: dict[int, np.ndarray] | None) -> None:
        """The coming step's expected experts per layer (None or {}: nothing expected)."""
        for ids in self.started.values():      # started for a layer that never ran
            self.c["wasted"] += len(ids)
        self.started = {}
        self.want = {int(k): np.unique(np.asarray(v, np.int64)) for k, v in (per_layer or {}).items() if len(v)}
        if self.want:
            self.c["steps"] += 1

    def take(self, layer: int) -> np.ndarray:
        """Layer's expected ids (once: a step's hint is used where it is taken)."""
        return self.want.pop(layer, np.empty(0, np.int64))

    def started_for(self, layer: int, ids: np.ndarray) -> None:
        if len(ids):
            self.started[layer] = np.asarray(ids, np.int64)
            self.c["prefetched"] += len(ids)

    def settle(self, layer: int, routed: np.ndarray) -> None:
        """Layer is routed to `routed` (ids within the layer): the copies started for it were used or not."""
        ids = self.started.pop(layer, None)
        if ids is None:
            return
        used = int(np.isin(ids, routed).sum())
        self.c["used"] += used
        self.c["wasted"] += len(ids) - used

    def stats(self) -> dict:
        p = self.c["prefetched"]
        return {**self.c, "hit_rate": self.c["used"] / p if p else 0.0}
