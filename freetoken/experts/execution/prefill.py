"""Prefill: whole-layer double-buffered streaming.

A long prompt routes to nearly every expert of every layer, so fetching on demand would
stream the whole pool with the device idle. Instead, while layer l computes from its
full expert set, the copy engine fills layer l+1's full set (no routing needed). The two
"buffers" are borrowed from the one slot pool: a layer's experts already resident stay
where they are, the rest take the least-recent slots, and everything stays an ordinary
cache entry afterwards (what survives prefill serves decode). A streamed layer's slots are
locked from its issue until its compute is done, so at most two layers are borrowed.

When the copies start: layers 0 and 1 at the step's start (`start`, from `begin_step`, while
the embedding and layer 0's attention run); layer l+2 as soon as layer l's experts have run
(its buffer is free again), i.e. before layer l+1's attention. So every layer's copy overlaps
the previous layer's MoE and its own attention, not only the MoE. On CUDA the copy stream
first waits for the compute stream's queued work (transfer.py: the reused slots may still
be read), so the copy of l+2 runs beside l+1's attention and MoE.

Used when the cache can hold two whole layers and the step routes at least 2*E
(token, expert) pairs (then ~86% of the layer's experts are expected to be used);
otherwise, or when two layers cannot be freed (slots locked), the layer falls back to
on-demand filling and never oversubscribes the cache. The top-k is learnt from the first
MoE call (until then a step's first layer issues its own copy, as before).
"""
from __future__ import annotations

import numpy as np
import torch

from ..memory.cache import ExpertCache


class LayerStreamer:
    def __init__(self, cache: ExpertCache, num_layers: int, num_experts: int):
        self.cache, self.L, self.E = cache, num_layers, num_experts
        self.issued: dict[int, tuple] = {}    # layer -> (job, slots[E], newly filled mask)

    top_k: int | None = None      # learnt at the first MoE call

    def worth_it(self, tokens: int, k: int, remember: bool = False) -> bool:
        if remember:
            self.top_k = k
        return self.cache.capacity >= 2 * self.E and tokens * k >= 2 * self.E

    def start(self, tokens: int | None) -> None:
        """Step start of a prefill of `tokens` tokens: begin copying layers 0 and 1."""
        if tokens and self.top_k and self.worth_it(tokens, self.top_k):
            self.issue(0)
            self.issue(1)

    def issue(self, layer: int) -> bool:
        """Start filling all of `layer`'s experts (locked until computed). False: no room."""
        if layer in self.issued:
            return True
        if layer >= self.L:
            return False
        cache = self.cache
        fids = np.arange(layer * self.E, (layer + 1) * self.E)
        slots = cache.slot_of[fids]
        have = slots >= 0
        cache.touch(slots[have])
        cache.lock(slots[have])
        need = fids[~have]
        cands = cache.candidates(len(need))
        if len(cands) < len(need):
            cache.unlock(slots[have])
            return False
        job = cache.install(need, cands)
        slots[~have] = cands
        self.issued[layer] = (job, slots, ~have)
        return True

    def _land(self, layer: int):
        job, slots, new = self.issued.pop(layer)
        if self.cache.pending[slots[~new]].any():     # an older background fill of this layer
            self.cache.drain()
        self.cache.ready(job, slots[new])
        return job, slots, new

    def forward(self, layer, hidden, flat, weights, device_run, stats):
        """The layer's output from its streamed experts, or None to fall back to on-demand."""
        if not self.issue(layer):
            return None
        self.issue(layer + 1)          # the second buffer (already issued unless the step began here)
        job, slots, new = self._land(layer)
        per_choice = torch.zeros(*flat.shape, hidden.shape[1], dtype=torch.float32, device=hidden.device)
        device_run(self.cache.slot_of[flat], hidden, weights, per_choice)   # summed as the on-demand path does
        out = per_choice.sum(1)
        self.cache.unlock(slots)
        self.issue(layer + 2)          # this buffer is free: the copy overlaps layer+1's attention
        n = int(new.sum())
        routed = np.unique(flat)
        routed = routed[routed >= 0]
        self.cache.table.record(routed)
        hit = ~new[routed - layer * self.E]
        was_hit = int(hit.sum())
        stats.add_experts("hits", routed[hit])
        stats.add_experts("fills", layer * self.E + np.flatnonzero(new))
        stats.add(layer, streamed_layers=1, fills=n, bytes_copied=n * int(self.cache.pool.layer_expert_nbytes[layer]),
                  hits=was_hit, misses=len(routed) - was_hit)
        return out

    def release_all(self) -> None:
        """Drop prefetched layers that were not consumed (end of a forward, resize)."""
        for layer in list(self.issued):
            _, slots, _ = self._land(layer)
            self.cache.unlock(slots)
