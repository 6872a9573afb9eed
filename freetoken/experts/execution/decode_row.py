"""A MoE layer's decode row in one C call on rows that never move (issue 38: a decode step
without a fixed tax).

A one-row decode step's attention half (layers/attention/decode_half.py) leaves the normed row,
the router's logits and the residual in that layer's own reused rows, so the arguments of the
MoE block's call (the executor's banks, those rows, the routes' scratch, the output row) are the
same every step: worked out once here. What `CpuExperts.forward_logits` does around the same
call a layer -- ~11 Python functions, a fresh output tensor, the ids read back into a Python
set, ~15 numpy counter updates -- becomes one call (`ft_moe_row`: `ft_moe_decode_add`, then
the per-expert counts in C) and three Python additions, summed into the backend's counters
when they are read (`RowCounts.flush`). Same call, same operands: the same bits."""
from __future__ import annotations

import threading
import time

import torch


class RowCounts:
    """A backend's rows and what they ran since their counters were last taken."""

    def __init__(self, stats, expert_bytes: list[int]):
        self.stats, self.expert_bytes = stats, expert_bytes
        self.rows: list[MoERow] = []
        self.lock = threading.Lock()       # (a server thread may read the counters mid-step)

    def flush(self) -> None:
        with self.lock:
            for row in self.rows:
                calls, distinct, seconds = row.calls, row.distinct, row.seconds     # (the engine thread only adds)
                if calls == row.taken[0]:
                    continue
                taken = row.taken
                self.stats.add_cpu_call(row.layer, (calls - taken[0]) * row.top_k, distinct - taken[1],
                                        self.expert_bytes[row.layer], seconds - taken[2], calls=calls - taken[0])
                row.taken = (calls, distinct, seconds)


class MoERow:
    """`CpuExpertExecutor.decode(x, logits, ..., residual)` of one row for MoE layer `layer`:
    `x`, `logits` and `residual` are the caller's reused rows ([1, H], [1, E], [1, H] fp32,
    contiguous), read at every call. The output is this row's own reused [1, H] row, or (`fresh`:
    a layer whose output outlives the step, the model's last) a new one each call. `counts`:
    the layer's per-expert counters (int64 [E], contiguous) or None."""

    def __init__(self, backend, layer: int, executor, offset: int, top_k: int, norm: bool, after: bool,
                 x: torch.Tensor, logits: torch.Tensor, residual: torch.Tensor, fresh: bool, counts: RowCounts,
                 per_expert):
        self.backend, self.layer, self.top_k, self.fresh = backend, layer, top_k, fresh
        self.ids, self.flat = torch.empty(top_k, dtype=torch.int64), torch.empty(top_k, dtype=torch.int64)
        self.w = torch.empty(top_k, dtype=torch.float32)
        self.rows = (x, logits, residual, per_expert)     # (alive with this row: the C call holds their addresses)
        self.out = torch.empty(1, residual.shape[1], dtype=torch.float32)
        self.lib, self.lock, args = executor.decode_row_args(
            logits, top_k, norm, after, offset, x, self.ids, self.flat, self.w, residual, self.out)
        self.args = (*args, None if per_expert is None else per_expert.ctypes.data)
        self.calls = self.distinct = 0
        self.seconds = 0.0
        self.taken = (0, 0, 0.0)              # (calls, distinct, seconds) in the backend's counters already
        counts.rows.append(self)

    def __call__(self) -> torch.Tensor:
        args = self.args
        if self.fresh:
            self.out = torch.empty_like(self.out)
            args = (*args[:-2], self.out.data_ptr(), args[-1])
        t0 = time.perf_counter()
        with self.lock:
            rc = self.lib.ft_moe_row(*args)
        self.seconds += time.perf_counter() - t0
        if rc < 0:
            raise IndexError("expert id out of range of the banks") if rc == -1 else \
                MemoryError("CPU expert kernel could not allocate its scratch memory")
        self.calls += 1
        self.distinct += rc
        return self.out
