"""B_P and B_H, measured (`freetoken profile`, bench/gpu_check.py): host -> cache copies of whole
expert rows, 8 at a time, and the CPU branch executing one decode token through 8 experts, alone
and at the same time (they share the host memory system). Random rows of the model's exact
layout: bandwidth depends on bytes and layout, not on values."""
from __future__ import annotations

import threading
import time

import numpy as np
import torch

from ...kernels.huge_pages import on_huge_pages
from ...progress import progress
from .bandwidth import BandwidthProfile, device_id, format_id, machine_id
from ..memory.cache import ExpertCache
from ..formats import quantize_banks, spec_format
from ..execution.host_exec import make_host_executor
from ..memory.pinning import pin_or_pageable
from ..memory.pool import ExpertPool, ExpertSpec
from ..memory.transfer import make_copy_engine

BATCH = 8


def synthetic_pool(hidden: int, inter: int, fmt: str, pool_gib: float) -> ExpertPool:
    one = quantize_banks(torch.randn(1, 2 * inter, hidden) * 0.02, torch.randn(1, hidden, inter) * 0.02, fmt)
    per = sum(b.nbytes for b in one.values())
    n = max(2 * BATCH, int(pool_gib * 2**30 // per))
    # real, distinct memory, on the 2 MiB pages the engine's banks are on (experts/memory/pool.py)
    banks = {k: on_huge_pages(v.expand(n, *v.shape[1:])) for k, v in one.items()}
    spec = ExpertSpec(hidden, inter, fmt=spec_format(fmt))
    return ExpertPool(banks, 1, n, spec)


def _timed(fn, seconds: float) -> tuple[int, float]:
    calls, t0 = 0, time.perf_counter()
    while True:
        fn(calls)
        calls += 1
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return calls, dt


def measure(pool: ExpertPool, device: torch.device, seconds: float = 1.0, threads: int | None = None,
            link_bytes_per_s: float | None = None, pin=None) -> BandwidthProfile:
    """pin: the pool's page-locking call (default pool.pin on CUDA; tests pass a fake). Refused,
    B_P is measured over pageable banks (what the engine then copies from), with one warning."""
    pinned = pin_or_pageable(pin) if pin else device.type != "cuda" or pin_or_pageable(pool.pin)
    S, N = pool.expert_nbytes, pool.num_experts
    cache = ExpertCache(pool, 2 * BATCH, device, make_copy_engine(device, link_bytes_per_s, pinned))
    host = make_host_executor(pool, threads)
    rng = np.random.default_rng(0)
    order = rng.permutation(N)
    slots = np.arange(BATCH) % cache.capacity

    def copy_batch(i):
        ids = order[(i * BATCH + np.arange(BATCH)) % N]
        cache.owner[:] = -1
        cache.slot_of[:] = -1
        job = cache.install(ids, slots)
        cache.ready(job, slots)
        cache.unlock(slots)
        job.wait()

    x = torch.randn(1, pool.spec.hidden)
    w = torch.full((1, BATCH), 1.0 / BATCH)

    def cpu_batch(i):
        ids = torch.from_numpy(order[(i * BATCH + N // 2 + np.arange(BATCH)) % N]).view(1, BATCH)
        host.run(x, ids, w)

    bar = progress(3, "profile B_P, B_H", unit="steps")
    copy_batch(0)
    cpu_batch(0)
    n, dt = _timed(copy_batch, seconds)
    b_p = n * BATCH * S / dt
    bar.update(1)
    n, dt = _timed(cpu_batch, seconds)
    b_h = n * BATCH * S / dt
    bar.update(1)

    stop, result = threading.Event(), {}

    def copier():
        k, t0 = 0, time.perf_counter()
        while not stop.is_set():
            copy_batch(k)
            k += 1
        result["b_p"] = k * BATCH * S / (time.perf_counter() - t0)

    th = threading.Thread(target=copier)
    th.start()
    n, dt = _timed(cpu_batch, seconds)
    stop.set()
    th.join()
    bar.update(1)
    bar.close()
    getattr(host, "close", lambda: None)()
    cache.copy.close()
    return BandwidthProfile(b_p=b_p, b_h=b_h, b_p_shared=result["b_p"], b_h_shared=n * BATCH * S / dt,
                            machine=machine_id(), device=device_id(device), fmt=format_id(pool),
                            expert_nbytes=S, threads=getattr(host, "num_threads", torch.get_num_threads()))
