"""Drafts as an expert lookahead: a verify's positions are known tokens before it runs, and the
experts a token routes to depend mostly on the token and the one before it. So the target's own
routing is remembered per (previous token, token), from every forward; before a step with
drafts, the union of what the verify's positions routed to last time is handed to the experts
backend per MoE layer (`Experts.expect`), which copies layer l's into its device or host cache
once layer l-1 is done, while the dense part between them runs (experts/memory/expected.py,
which also counts each copy used or wasted). Drafts from the session's history (suffix, n-gram)
repeat tokens the target just ran, in the same context, so their routing is known ahead.
Outputs never change: only where experts are when they are needed."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch

from ...experts.base import Experts
from .routing import moe_layers

MAX_KEYS = 1 << 15      # remembered (previous token, token) pairs: ~L*top_k*2 bytes each (Qwen3-30B: 768 B)
MAX_ROWS = 4096         # forwards with more rows (long prefill chunks) teach only their first rows


def _key(prev: int, tok: int) -> int:
    return (prev + 1) << 32 | tok


class ExpertLookahead:
    def __init__(self, model, max_keys: int = MAX_KEYS):
        self.layers = moe_layers(model)
        self.experts = getattr(model, "experts", None)
        self.max_keys = max_keys
        self.memory: OrderedDict[int, np.ndarray] = OrderedDict()   # key -> [layers, top_k] expert ids
        self._keys: list[int] = []
        self._routes: dict[int, torch.Tensor] = {}
        self.positions = 0          # verify positions looked up
        self.known = 0              # ... whose routing was remembered
        if self.active:
            for m in self.layers:
                m.on_route = self._hook(m.on_route)

    @property
    def active(self) -> bool:
        """A backend that takes hints (one with a cache); others (resident, cpu) would only pay
        for the remembering."""
        inner = getattr(self.experts, "inner", self.experts)      # a routing recorder wraps the backend
        return bool(self.layers) and inner is not None and type(inner).expect is not Experts.expect

    def _hook(self, prev):
        def on_route(layer, ids, w):
            self._routes[layer] = ids
            if prev is not None:
                prev(layer, ids, w)
        return on_route

    def begin(self, batch) -> None:
        """Before a forward of `batch` [(seq, rows)]: the keys of its rows (to learn from), and
        for a step with drafts the experts its verify positions are expected to route."""
        self._routes = {}
        self._keys = []
        want_rows = []
        for seq, n in batch:
            ids = seq.all_ids + seq.draft if seq.draft else seq.all_ids
            s = seq.num_computed
            keys = [_key(ids[p - 1] if p else -1, ids[p]) for p in range(s, s + n)]
            self._keys += keys
            if seq.draft:
                want_rows += keys
        self._keys = self._keys[:MAX_ROWS]
        self.experts.expect(self._expected(want_rows) if want_rows else None)

    def _expected(self, keys: list[int]) -> dict[int, np.ndarray] | None:
        known = [r for k in keys if (r := self.memory.get(k)) is not None]
        self.positions += len(keys)
        self.known += len(known)
        if not known:
            return None
        routed = np.stack(known)                     # [positions, layers, top_k]
        return {m.moe_layer: np.unique(routed[:, i]) for i, m in enumerate(self.layers)}

    def end(self) -> None:
        """After the forward: remember each row's routing under its key."""
        T = len(self._keys)
        got = [self._routes.get(m.moe_layer) for m in self.layers]
        self._routes = {}
        if not T or any(r is None or r.shape[0] < T for r in got):
            return
        routed = torch.stack([r[:T] for r in got], 1).to("cpu", torch.int16).numpy()   # [T, layers, top_k]
        mem = self.memory
        for key, row in zip(self._keys, routed):
            mem[key] = row
            mem.move_to_end(key)
        while len(mem) > self.max_keys:
            mem.popitem(last=False)

    def stats(self) -> dict:
        out = {"remembered": len(self.memory), "positions": self.positions, "known_positions": self.known}
        exp = getattr(self.experts, "expected", None)
        if exp is not None:
            out.update(exp.stats())
        return out
