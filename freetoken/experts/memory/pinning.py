"""Page-locking the host expert banks in place, once, after they are filled.

`torch.Tensor.pin_memory()` copies the bank into a new pinned block (PyTorch's caching host
allocator, which also rounds each block up to a power of two): the pool's host memory doubles
during start-up. Registering the filled buffer itself (`cudaHostRegister`) pins the same pages
without a copy. The register/unregister calls are the only device-specific part; tests pass
their own that record bytes."""
from __future__ import annotations

import logging

import torch

log = logging.getLogger("freetoken.experts")


class PinError(RuntimeError):
    pass


def page_size() -> int:
    try:
        import os
        return os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 4096


def registered_bytes(nbytes: int, regions: int = 1) -> int:
    """Bytes page-locked by registering `regions` buffers of `nbytes` in all (cudaHostRegister
    locks whole pages: an unaligned start and end each touch one more page)."""
    return -(-nbytes // page_size()) * page_size() + regions * page_size() if nbytes else 0


def caching_host_block(nbytes: int) -> int:
    """What PyTorch's caching host allocator (`pin_memory=True`) takes for one `nbytes` request:
    the next power of two."""
    return 1 << max(0, int(nbytes) - 1).bit_length() if nbytes > 0 else 0


def cuda_register(t: torch.Tensor) -> None:
    """Page-locks tensor t's buffer in place (cudaHostRegisterDefault)."""
    rt = torch.cuda.cudart()
    err = rt.cudaHostRegister(t.data_ptr(), t.untyped_storage().nbytes(), 0)
    if int(err) != 0:
        raise PinError(f"cudaHostRegister failed ({err}) for {t.nbytes / 2**20:.1f} MiB")


def cuda_unregister(t: torch.Tensor) -> None:
    torch.cuda.cudart().cudaHostUnregister(t.data_ptr())


def memlock_limit() -> int | None:
    """RLIMIT_MEMLOCK soft limit in bytes (`ulimit -l`), None when unlimited or unknown."""
    try:
        import resource
        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else soft


def pin_banks(banks: dict[str, torch.Tensor], register=cuda_register, unregister=cuda_unregister,
              limit: int | None = None) -> list[torch.Tensor]:
    """Registers every bank in place; returns the registered tensors. All or nothing: on the
    first refusal (or when the banks exceed `limit`) what was registered is released and
    PinError is raised, leaving pageable banks."""
    total = sum(b.untyped_storage().nbytes() for b in banks.values())
    if limit is not None and total > limit:
        raise PinError(f"{total / 2**30:.2f} GiB of banks exceed the page-lock limit of {limit / 2**30:.2f} GiB")
    done: list[torch.Tensor] = []
    try:
        for b in banks.values():
            if b.numel():
                register(b)
                done.append(b)
    except Exception as e:                  # noqa: BLE001 -- every refusal leaves pageable banks
        for b in done:
            try:
                unregister(b)
            except Exception:               # noqa: BLE001
                pass
        raise PinError(str(e) or type(e).__name__) from None
    return done


def pin_or_pageable(pin) -> bool:
    """Calls `pin()` (the pool's page-locking); False with one warning when it is refused or
    capped: the tiered backend then keeps pageable banks, runs cache hits on the device and
    every miss on the CPU (policy `pageable`, experts/memory/planner.py)."""
    try:
        pin()
    except PinError as e:                   # refused or capped (ulimit -l, Windows/WSL limits)
        log.warning("cannot pin the expert pool in place (%s); pageable banks: cache hits run on the device, "
                    "misses on the CPU, the cache fills in the background", e)
        return False
    return True


class PinnedBanks:
    """The banks one pool page-locked in place and how to undo it (ExpertPool, GroupedPool):
    all or nothing, never a copy."""

    def __init__(self):
        self.registered: list[torch.Tensor] = []
        self.nbytes = 0
        self._unregister = None

    def pin(self, banks: dict[str, torch.Tensor], register=None, unregister=None, limit: int | None = -1) -> int:
        if self.nbytes:
            return self.nbytes
        register = register or cuda_register
        unregister = unregister or cuda_unregister
        limit = memlock_limit() if limit == -1 else limit
        self.registered = pin_banks(banks, register, unregister, limit)
        self._unregister = unregister
        self.nbytes = sum(b.untyped_storage().nbytes() for b in self.registered)
        return self.nbytes

    def unpin(self) -> None:
        for b in self.registered:
            self._unregister(b)
        self.registered, self.nbytes = [], 0
