"""The host cache's layer call at full hits in one C call to lock and one to release
(kernels/c/host_hits.c): the same slots, locks and read-ahead marks as `HostExpertCache`'s numpy
path (issue 39: in situ each numpy call of the hit path cost several times its loop cost)."""
from __future__ import annotations

import numpy as np

from ... import kernels

# the hit path's lock and release in C; False: numpy (tests force either, on every build)
ENABLED = True


class HitCalls:
    """`ft_hits_acquire` / `ft_hits_release` over one cache's arrays, their addresses taken once
    (`.ctypes.data` ~1.5 us a use) and again when an array is replaced (a resize)."""

    def __init__(self, lib):
        self.lib = lib
        self._arrays: tuple = ()
        self._addr: tuple = ()

    @classmethod
    def of(cls, build: str | None) -> HitCalls | None:
        """The calls of kernel `build` ("native", "avx2", "portable"), or None: numpy (`build`
        None, `ENABLED` off, or no library here)."""
        lib = kernels.load(build) if build and ENABLED else None
        return cls(lib) if lib is not None else None

    def _addresses(self, ready_of: np.ndarray, locks: np.ndarray, prefetched: np.ndarray) -> tuple:
        arrays = (ready_of, locks, prefetched)
        if len(arrays) != len(self._arrays) or any(a is not b for a, b in zip(arrays, self._arrays)):
            self._arrays, self._addr = arrays, tuple(a.ctypes.data for a in arrays)
        return self._addr

    def acquire(self, ready_of: np.ndarray, locks: np.ndarray, prefetched: np.ndarray, uniq: np.ndarray,
                flat: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool, int] | None:
        """(the slots of `flat`, of `uniq` -- each locked once --, whether those ascend, the
        read-ahead marks cleared), or None and nothing changed: one of `flat` not landed."""
        r, lk, pf = self._addresses(ready_of, locks, prefetched)
        uniq = np.ascontiguousarray(uniq, np.int64)
        flat = np.ascontiguousarray(flat, np.int64)
        slots, su = np.empty(flat.shape, np.int64), np.empty(len(uniq), np.int64)
        got = self.lib.ft_hits_acquire(r, uniq.ctypes.data, len(uniq), flat.ctypes.data, flat.size, lk, pf,
                                       slots.ctypes.data, su.ctypes.data)
        if got < 0:
            return None
        return slots, su, bool(got & 1), int(got >> 1)

    def route(self, ids, T: int, K: int, off: int) -> tuple[np.ndarray, np.ndarray]:
        """(flat [T, K] = the routed ids + `off`, their distinct values ascending): `ids` the
        address of T x K contiguous int64 (a decode call's top-k tensor's)."""
        buf = np.empty(2 * T * K, np.int64)
        at = buf.ctypes.data
        nu = self.lib.ft_hits_route(ids, T * K, off, at, at + 8 * T * K)
        return buf[:T * K].reshape(T, K), buf[T * K:T * K + nu]

    def release(self, locks: np.ndarray, su: np.ndarray) -> None:
        """Each of `su` (distinct slots, from `acquire`) unlocked once."""
        self.lib.ft_hits_release(locks.ctypes.data, su.ctypes.data, len(su))
