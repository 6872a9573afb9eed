"""`resident` backend: every expert on the execution device, no cache."""
from __future__ import annotations

import torch

from ..base import Experts
from ..memory.pool import ExpertPool
from .. import ggml_slots
from .torch_exec import run_experts, run_slots

# Decode batches up to this many routed (token, choice) pairs run as batched matmuls gathered by
# expert id (run_slots: no host sync, so a CUDA graph can capture them); larger batches group
# per expert (run_experts), which would gather far more weight rows than it computes with.
SYNC_FREE_PAIRS = 512


class ResidentExperts(Experts):
    def __init__(self, pool: ExpertPool, device: torch.device, sync_free: bool | None = None):
        """sync_free: small batches without host syncs (default on CUDA; tests force it)."""
        self.pool = pool
        # one bank dict per group of layers (a GroupedPool's row widths; else the one pool)
        self.group_banks = [{k: b.to(device) for k, b in g.banks.items()} for g in pool.groups]
        self.group_types = [ggml_slots.pool_types(g) for g in pool.groups]   # ggml: read once, on the host
        self.banks = self.group_banks[0] if len(self.group_banks) == 1 else None
        self.calls = 0
        self.sync_free = (torch.device(device).type == "cuda") if sync_free is None else sync_free

    def forward(self, layer, hidden, topk_ids, topk_weights):
        self.calls += 1
        group, local = self.pool.layer_group(layer)
        banks, flat = self.group_banks[group], topk_ids + local * self.pool.num_experts
        if self.sync_free and flat.numel() <= SYNC_FREE_PAIRS:
            T, K = flat.shape
            per_choice = torch.zeros(T, K, hidden.shape[1], dtype=torch.float32, device=hidden.device)
            run_slots(banks, self.pool.spec, flat, hidden, topk_weights, per_choice, types=self.group_types[group])
            return per_choice.sum(1).to(hidden.dtype)
        return run_experts(banks, self.pool.spec, flat, hidden, topk_weights).to(hidden.dtype)

    def stats(self) -> dict:
        return {"backend": "resident", "calls": self.calls}
