"""The memory roofline of CPU expert execution.

read_bandwidth():            STREAM-like read test: all worker threads sum disjoint parts of a
                             buffer far larger than the caches (bytes/s).
measure_expert_bandwidth():  B_H, bytes of expert weights consumed per second by an executor
                             on its own bank shapes, with fresh random routes every call so
                             the weights come from DRAM, not the caches.
roofline():                  both, side by side, for `freetoken profile`."""
from __future__ import annotations

import time

import torch

from ... import kernels
from ...kernels.huge_pages import huge_empty
from ...kernels.pool import CpuPool
from ..execution.cpu import CpuExpertExecutor
from ..formats import weight_banks, weight_keys


CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}
"""wall: elapsed time (what serving sees). thread: CPU time of the calling thread, for
single-threaded runs on a shared machine, where it approximates a dedicated core."""


def _best_rate(fn, nbytes: int, repeats: int, clock: str = "wall") -> float:
    now = CLOCKS[clock]
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = now()
        fn()
        best = min(best, now() - t0)
    return nbytes / max(best, 1e-9)


def read_bandwidth(nbytes: int = 1 << 29, repeats: int = 5, num_threads: int | None = None,
                   clock: str = "wall") -> float:
    """Best-of-`repeats` read bandwidth in bytes/s, with the kernel thread pool (pinned, one
    thread per physical core) or with torch when no kernel library can be built. The buffer is on
    2 MiB pages, as the weights the kernels stream are (kernels/huge_pages.py): over 4 KiB pages
    this probe read 0.6x as fast on the Zen 4 of issue 38, below what the decode kernels reach."""
    buf = huge_empty((nbytes // 8,), torch.int64).fill_(1)
    lib = kernels.load()
    if lib is None:
        return torch_read_bandwidth(buf, repeats, clock)
    pool = CpuPool(lib, num_threads, spin_us=200)
    try:
        return _best_rate(lambda: lib.ft_read_bytes(pool.handle, buf.data_ptr(), buf.nbytes), buf.nbytes, repeats, clock)
    finally:
        pool.close()


def torch_read_bandwidth(buf: torch.Tensor | None = None, repeats: int = 5, clock: str = "wall") -> float:
    """The same test with torch's own reduction (torch.sum over int64)."""
    if buf is None:
        buf = torch.ones((1 << 29) // 8, dtype=torch.int64)
    return _best_rate(lambda: buf.sum(), buf.nbytes, repeats, clock)


def expert_nbytes(executor: CpuExpertExecutor) -> int:
    """Bytes of one expert's weights and scales (what a decode step streams per routed expert)."""
    return sum(executor.banks[k][0].nbytes for k in weight_banks(executor.fmt))


def measure_expert_bandwidth(executor: CpuExpertExecutor, tokens: int = 1, top_k: int = 8,
                             seconds: float = 1.0, min_iters: int = 5, seed: int = 0,
                             clock: str = "wall") -> float:
    """B_H in bytes/s: weights of the distinct experts routed in a call / wall time of the call,
    over calls with fresh random distinct expert sets (tokens x top_k routes each)."""
    n = executor.banks[weight_keys(executor.fmt)[0]].shape[0]
    top_k = min(top_k, n)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, executor.H, generator=g)
    out = torch.zeros(tokens, executor.H)
    per = expert_nbytes(executor)
    now = CLOCKS[clock]
    executor.run(x, torch.randperm(n, generator=g)[:top_k].repeat(tokens, 1), torch.ones(tokens, top_k), out)
    total_bytes, total_t, iters = 0, 0.0, 0
    while iters < min_iters or total_t < seconds:
        ids = torch.stack([torch.randperm(n, generator=g)[:top_k] for _ in range(tokens)])
        w = torch.rand(tokens, top_k, generator=g)
        t0 = now()
        executor.run(x, ids, w, out)
        total_t += now() - t0
        total_bytes += int(torch.unique(ids).numel()) * per
        iters += 1
    return total_bytes / max(total_t, 1e-9)


def roofline(executor: CpuExpertExecutor, tokens: int = 1, top_k: int = 8, seconds: float = 1.0,
             read_bytes: int = 1 << 29) -> dict:
    """{"read_bw": B/s, "b_h": B/s, "ratio": b_h/read_bw, "fmt", "isa", "threads", "tokens", "top_k"}."""
    read = read_bandwidth(read_bytes, num_threads=getattr(executor, "num_threads", None))
    b_h = measure_expert_bandwidth(executor, tokens, top_k, seconds)
    return {"read_bw": read, "b_h": b_h, "ratio": b_h / read, "fmt": executor.fmt, "isa": executor.isa,
            "threads": getattr(executor, "num_threads", 1), "tokens": tokens, "top_k": top_k}
