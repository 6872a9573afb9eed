"""`CpuPool.park` (the disk tier calls it before it waits on a read): the idle workers go to
sleep at once instead of spinning out their spin time, and the next call wakes them and runs
on every thread as before (its result the same as an unparked pool's)."""
from __future__ import annotations

import time

import numpy as np
import pytest

from freetoken.kernels import load
from freetoken.kernels.pool import CpuPool

lib = load()
pytestmark = pytest.mark.skipif(lib is None, reason="no C compiler for the kernels")


def _sleeping_soon(pool: CpuPool, want: int, patience_s: float = 30.0) -> int:
    """The pool's sleeping workers once they are `want`, or what they are when patience runs out
    (a state polled, not a time asserted: a loaded box may take a while to run the worker)."""
    end = time.monotonic() + patience_s
    while lib.ft_pool_sleeping(pool.handle) != want and time.monotonic() < end:
        time.sleep(0.01)
    return lib.ft_pool_sleeping(pool.handle)


def test_park_sleeps_the_spinning_workers_and_a_call_wakes_them():
    spin = CpuPool(lib, 2, pin=False, spin_us=600_000_000)      # would spin 10 minutes after each call
    plain = CpuPool(lib, 2, pin=False, spin_us=0)
    buf = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8)
    try:
        want = lib.ft_read_bytes(plain.handle, buf.ctypes.data, buf.nbytes)    # both threads' share
        for _ in range(3):
            spin.park()
            assert _sleeping_soon(spin, 1) == 1
            assert lib.ft_read_bytes(spin.handle, buf.ctypes.data, buf.nbytes) == want
            assert lib.ft_pool_sleeping(spin.handle) == 0       # the call woke it; it spins again
    finally:
        spin.close()
        plain.close()


def test_park_of_a_closed_pool_does_nothing():
    pool = CpuPool(lib, 2, pin=False, spin_us=0)
    pool.close()
    pool.park()
