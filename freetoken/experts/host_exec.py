"""The CPU branch's executor: the fast kernels of `cpu.py` when they are there, else
torch on the host pool behind the same call shape."""
from __future__ import annotations

import torch

from ..kernels.pool import SPIN_US, shared_pool
from .cpu import CpuExpertExecutor
from .pool import ExpertPool
from .torch_exec import run_experts


class TorchHostExecutor:
    """`run(x[T,H], flat_ids[T,K] (<0 skip), weights[T,K], out=None) -> float32 [T,H]`."""

    def __init__(self, pool: ExpertPool):
        self.pool = pool

    def run(self, x, expert_ids, weights, out=None):
        return run_experts(self.pool.banks, self.pool.spec, torch.as_tensor(expert_ids), x, weights, out=out)


def make_host_executor(pool: ExpertPool, num_threads: int | None = None, prefer_fast: bool = True,
                       spin_us: int = SPIN_US, isa: str = "native"):
    if prefer_fast:
        try:   # the process's one kernel pool, shared with the dense layers and attention
            return CpuExpertExecutor.from_pool(pool, pool=shared_pool(num_threads, isa=isa, spin_us=spin_us))
        except (ValueError, NotImplementedError):
            pass                     # a format the kernels do not cover yet
    return TorchHostExecutor(pool)
