"""`record_routing`: every step's routing (phase, step, layer, ids, weights) to a trace file
in the trace format the simulator reads (trace_format.py), around any experts backend."""
from __future__ import annotations

from ..base import Experts
from .trace_format import TraceWriter


class RoutingRecorder(Experts):
    def __init__(self, inner: Experts, path: str, header: dict):
        self.inner, self.path, self.header = inner, path, header
        self.writer = None                       # opened at the first forward, when top-k is known
        self.phase, self.step = "decode", -1
        self.keeps_expert_cache = inner.keeps_expert_cache

    def begin_step(self, phase: str, tokens: int | None = None) -> None:
        self.phase, self.step = phase, self.step + 1
        self.inner.begin_step(phase, tokens)

    def forward(self, layer, hidden, topk_ids, topk_weights):
        if self.writer is None:
            self.writer = TraceWriter(self.path, {**self.header, "top_k": int(topk_ids.shape[1])})
        self.writer.write(self.phase, self.step, layer, topk_ids, topk_weights)
        return self.inner.forward(layer, hidden, topk_ids, topk_weights)

    def expect(self, per_layer: dict | None) -> None:
        self.inner.expect(per_layer)

    def blocked_seconds(self) -> float:
        return self.inner.blocked_seconds()

    def miss_seconds(self) -> float | None:
        return self.inner.miss_seconds()

    def stats(self) -> dict:
        return {**self.inner.stats(), "routing_trace": self.path}

    def cache_size(self) -> dict | None:
        return self.inner.cache_size()

    def resize_cache_bytes(self, nbytes: int) -> dict | None:
        return self.inner.resize_cache_bytes(nbytes)

    def host_cache_size(self) -> dict | None:
        return self.inner.host_cache_size()

    def resize_host_cache_bytes(self, nbytes: int) -> dict | None:
        return self.inner.resize_host_cache_bytes(nbytes)

    def pinned_bytes(self) -> int:
        return self.inner.pinned_bytes()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.inner.close()
