"""The worker pool of the C kernels: persistent threads, one per physical core, pinned.

One pool per process serves the dense layers and the routed experts of a pure-CPU engine
(`shared_pool`): two pools pinned to the same cores would take turns through the scheduler
on every call. A pool runs one kernel call at a time (`lock`); ctypes releases the GIL
during the call, so attention on another Python thread still overlaps."""
from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

from . import load
from ..defaults import SPIN_US


def physical_cpus() -> list[int]:
    """One logical CPU per physical core among those this process may run on."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    seen, cpus = set(), []
    for c in allowed:
        base = f"/sys/devices/system/cpu/cpu{c}/topology/"
        try:
            key = tuple(Path(base + f).read_text().strip() for f in ("physical_package_id", "core_id"))
        except OSError:
            key = ("?", str(c))
        if key not in seen:
            seen.add(key)
            cpus.append(c)
    return cpus or [0]


class CpuPool:
    """`num_threads` workers (default: one per physical core); the calling thread is worker 0.
    After a call the workers spin `spin_us` before sleeping on a condition variable. Calls that
    read fewer than `small_job_bytes` run on the calling thread alone (tiny layers: the hand-off
    would cost more than the work; 0 = always split, as the kernel tests want)."""

    def __init__(self, lib: ctypes.CDLL, num_threads: int | None = None, pin: bool = True, spin_us: int = 0,
                 small_job_bytes: int = 0):
        cpus = physical_cpus()
        n = num_threads or len(cpus)
        pinned = (ctypes.c_int * n)(*[cpus[i % len(cpus)] for i in range(n)]) if pin and n <= len(cpus) else None
        self.lib, self.num_threads = lib, n
        self.lock = threading.Lock()
        self.handle = lib.ft_pool_create(n, pinned, spin_us * 1000, small_job_bytes)

    def park(self) -> None:
        """The idle workers sleep now rather than spin out `spin_us` (the caller is about to
        block on something slower than a spin, a disk read); the next call wakes them. A pool
        busy with another caller's call is left as it is (its workers are not idle)."""
        if self.lock.acquire(blocking=False):
            try:
                if self.handle is not None and hasattr(self.lib, "ft_pool_park"):
                    self.lib.ft_pool_park(self.handle)
            finally:
                self.lock.release()

    def close(self) -> None:
        with self.lock:
            if self.handle is not None:
                self.lib.ft_pool_destroy(self.handle)
                self.handle = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


_shared: dict[tuple[str, int], CpuPool] = {}
_shared_lock = threading.Lock()
# How long the shared pool's workers spin after a call before sleeping. A decode step makes
# ~4 kernel calls per layer with 20-100 us of Python between them: spinning across those gaps
# saves a futex wake-up (~10-50 us) per call; between steps the workers go to sleep.
# The engine passes FREETOKEN_SPIN_US (read once by memory/resolve.py into Settings.spin_us); defaults.SPIN_US otherwise.
SMALL_JOB_BYTES = 256 << 10     # ~10 us of streaming on one core


def shared_pool(num_threads: int | None = None, isa: str = "native", spin_us: int = SPIN_US) -> CpuPool | None:
    """The process-wide pool for `num_threads` (None: one per physical core), or None when the
    kernels cannot be built here. The first call for a thread count decides its spin time."""
    lib = load(isa)
    if lib is None:
        return None
    key = (isa, num_threads or len(physical_cpus()))
    with _shared_lock:
        if key not in _shared:
            _shared[key] = CpuPool(lib, key[1], spin_us=spin_us, small_job_bytes=SMALL_JOB_BYTES)
        return _shared[key]
