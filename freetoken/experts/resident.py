"""`resident` backend: every expert on the execution device, no cache."""
from __future__ import annotations

import torch

from .base import Experts
from .pool import ExpertPool
from .torch_exec import run_experts


class ResidentExperts(Experts):
    def __init__(self, pool: ExpertPool, device: torch.device):
        self.pool = pool
        self.banks = {k: b.to(device) for k, b in pool.banks.items()}
        self.calls = 0

    def forward(self, layer, hidden, topk_ids, topk_weights):
        self.calls += 1
        flat = self.pool.flat_ids(layer, topk_ids)
        return run_experts(self.banks, self.pool.spec, flat, hidden, topk_weights).to(hidden.dtype)

    def stats(self) -> dict:
        return {"backend": "resident", "calls": self.calls}
