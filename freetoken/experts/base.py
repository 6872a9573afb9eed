"""The experts seam: a MoE block routes, then hands its tokens to an `Experts` object.

Model files never know where experts live; every backend (resident, offload, cpu,
hybrid) implements this one interface and must return the same numbers."""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch

# The experts backends (`moe_backend`; "auto" picks one, see loading/experts_backend.py).
BACKENDS = ("resident", "offload", "cpu", "hybrid")


class Experts(ABC):
    # Whether this backend keeps a cache the steps fill (a device slot cache, the disk tier's
    # host cache): made-up tokens (engine/verify_probe.py) would fill it with experts nobody asked for.
    keeps_expert_cache = False

    @abstractmethod
    def forward(self, layer: int, hidden: torch.Tensor, topk_ids: torch.Tensor,
                topk_weights: torch.Tensor) -> torch.Tensor:
        """Gate-weighted sum of the routed experts' outputs.

        layer: MoE-layer ordinal (0..num_moe_layers-1); hidden [T, H];
        topk_ids [T, K] expert ids within the layer; topk_weights [T, K].
        Returns [T, H] in hidden's dtype."""

    def begin_step(self, phase: str, tokens: int | None = None) -> None:
        """Called once per model forward, before the first layer, with "prefill" or "decode"
        (the step's dominant phase) and the step's token count (a backend may start copying
        the first layers' experts now, while the embedding and the first attention run)."""

    def expect(self, per_layer: dict | None) -> None:
        """The coming step's expected experts per layer ({layer: ids within the layer}, from
        speculative drafts: memory/expected.py). A backend with a cache starts copying layer l's
        once layer l-1 is done; outputs never change. Default: ignored (nothing to bring closer)."""

    def blocked_seconds(self) -> float:
        """Seconds layer calls have waited on expert reads so far (a miss read from the disk on
        demand); what a step's time holds beyond its compute (the speculative price reads it
        per step). Default: 0, a backend whose experts are in memory never waits on a read."""
        return 0.0

    def miss_seconds(self) -> float | None:
        """Seconds one expert's read on a demand miss takes at the bandwidth this backend
        measured or was profiled at: the speculative price's prior for what each expert a
        verify adds beyond a plain step's costs. None (the default): a miss reads nothing."""
        return None

    def stats(self) -> dict:
        return {}

    # ---- memory: what the engine's elastic memory (engine/resize.py) and /v1/memory read ----
    def cache_size(self) -> dict | None:
        """The device slot cache now -- {"bytes", "slots", "resident", "device"} -- sized first
        if it waited for the first step; None when this backend has no cache to resize
        (resident, cpu, disk)."""
        return None

    def resize_cache_bytes(self, nbytes: int) -> dict | None:
        """Rebuild the slot cache with as many whole experts as `nbytes` holds (at most the
        pool), at a safe point (between steps). Returns {"before", "after"} bytes and
        {"slots_before", "slots_after"}; None without a cache."""
        return None

    def host_cache_size(self) -> dict | None:
        """The disk tier's host (RAM) expert cache now -- {"bytes", "slots", "resident",
        "expert_bytes", "device": "host"}; None when the pool is in memory (no host cache)."""
        return None

    def resize_host_cache_bytes(self, nbytes: int) -> dict | None:
        """Resize the host cache to the whole experts `nbytes` holds, at a safe point (between
        steps): at least one slot, at most the pool, `clamped` says which limit applied.
        Returns {"before", "after"} bytes, {"slots_before", "slots_after"}, "evicted" (residents
        that left) and "clamped" ("" when `nbytes` was taken as asked); None without a host cache."""
        return None

    def pinned_bytes(self) -> int:
        """Host bytes of the pool page-locked in place now (0: nothing pinned)."""
        return 0

    def close(self) -> None:
        """Release worker threads / device memory."""


class ExpertsSeat:
    """Where a model's MoE layers reach its experts. A model is built before its experts (the
    loader builds them from the model's pool), so its layers hold this seat and the loader seats
    the backend (`MoECausalLM.attach_experts`): building goes one way, the model never calls the
    loader."""
    backend: Experts | None = None

    def forward(self, layer: int, hidden: torch.Tensor, topk_ids: torch.Tensor,
                topk_weights: torch.Tensor) -> torch.Tensor:
        return self.backend.forward(layer, hidden, topk_ids, topk_weights)

    def forward_logits(self, layer: int, hidden: torch.Tensor, logits: torch.Tensor, top_k: int, norm: bool,
                       after: bool, routes=None, residual=None) -> torch.Tensor | None:
        """The backend's routing + experts in one call where it has one (CpuExperts), else None;
        with `residual`, residual + the experts' output."""
        fn = getattr(self.backend, "forward_logits", None)
        if fn is None:
            return None
        return fn(layer, hidden, logits, top_k, norm, after, routes) if residual is None else \
            fn(layer, hidden, logits, top_k, norm, after, routes, residual)

    def decode_row(self, *args):
        """The backend's one-row decode call on reused rows where it has one (CpuExperts.decode_row), else None."""
        fn = getattr(self.backend, "decode_row", None)
        return None if fn is None else fn(*args)
