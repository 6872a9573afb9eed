"""The CPU branch's executor: the fast kernels of `cpu.py` when they are there, else
torch on the host pool behind the same call shape."""
from __future__ import annotations

import torch

from ...kernels.pool import SPIN_US, shared_pool
from .cpu import CpuExpertExecutor
from ..memory.pool import ExpertPool
from .torch_exec import run_experts


class TorchHostExecutor:
    """`run(x[T,H], flat_ids[T,K] (<0 skip), weights[T,K], out=None) -> float32 [T,H]`."""

    def __init__(self, pool: ExpertPool):
        if len(pool.groups) > 1:
            raise ValueError("TorchHostExecutor runs one group; a grouped pool takes GroupedExecutor")
        self.pool = pool

    def run(self, x, expert_ids, weights, out=None):
        return run_experts(self.pool.banks, self.pool.spec, torch.as_tensor(expert_ids), x, weights, out=out)


class GroupedExecutor:
    """A host executor per group of a `GroupedPool` (grouped_pool.py) behind the same call: each
    group's executor gets the call's ids that are its own (as its flat ids) and adds into `out`."""

    def __init__(self, pool, executors: list):
        self.pool, self.executors = pool, executors
        self.last_experts = 0
        first = executors[0]
        self.isa = getattr(first, "isa", "torch")
        self.num_threads = getattr(first, "num_threads", 1)
        self.fmt = getattr(first, "fmt", pool.spec.fmt)

    def run(self, x, expert_ids, weights, out=None):
        ids = torch.as_tensor(expert_ids)
        if out is None:
            out = torch.zeros(x.shape[0], self.pool.spec.hidden, dtype=torch.float32, device=x.device)
        self.last_experts = 0
        for group, local in self.pool.split_ids(ids):
            ex = self.executors[group]
            ex.run(x, local, weights, out=out)
            self.last_experts += getattr(ex, "last_experts", 0)
        return out

    def run_layer(self, layer: int, x, expert_ids, weights):
        """`run` of one layer's few routed pairs (expert_ids [T, K]: that layer's expert numbers,
        < 0 skip) -> (float32 [T, H], the sorted flat ids `layer * E + id` of the pairs, as
        Python ints): the group's ids by one add, no flat-id tensors and no split."""
        E = self.pool.num_experts
        flat = expert_ids.reshape(-1).tolist()
        group, local_layer = self.pool.layer_group(layer)
        local = expert_ids.long() + local_layer * E
        if min(flat) < 0:
            local = torch.where(expert_ids >= 0, local, -1)
        out = torch.zeros(x.shape[0], self.pool.spec.hidden, dtype=torch.float32, device=x.device)
        ex = self.executors[group]
        ex.run(x, local, weights, out=out)
        self.last_experts = getattr(ex, "last_experts", 0)
        return out, sorted({layer * E + i for i in flat})

    def layer_executor(self, layer: int) -> tuple:
        """(the executor of `layer`'s group, the offset of its ids there)."""
        group, local_layer = self.pool.layer_group(layer)
        return self.executors[group], local_layer * self.pool.num_experts

    def close(self) -> None:
        for ex in self.executors:
            getattr(ex, "close", lambda: None)()


def cpu_executor(expert_pool, **kw):
    """CpuExpertExecutor.from_pool; for a `GroupedPool` one per group behind a GroupedExecutor."""
    if len(expert_pool.groups) > 1:
        return GroupedExecutor(expert_pool, [cpu_executor(g, **kw) for g in expert_pool.groups])
    return CpuExpertExecutor.from_pool(expert_pool, **kw)


def make_host_executor(pool: ExpertPool, num_threads: int | None = None, prefer_fast: bool = True,
                       spin_us: int = SPIN_US, isa: str = "native"):
    if len(pool.groups) > 1:
        return GroupedExecutor(pool, [make_host_executor(g, num_threads, prefer_fast, spin_us, isa)
                                      for g in pool.groups])
    if prefer_fast:
        try:   # the process's one kernel pool, shared with the dense layers and attention
            return CpuExpertExecutor.from_pool(pool, pool=shared_pool(num_threads, isa=isa, spin_us=spin_us))
        except (ValueError, NotImplementedError):
            pass                     # a format the kernels do not cover yet
    return TorchHostExecutor(pool)
