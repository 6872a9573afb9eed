"""Elastic memory for the disk tier's host expert cache (experts/disk.py, host_cache.py): the
`host_cache` component of `LLMEngine.memory_sizes` / `resize_memory`, in GiB like the
`host_cache_gib` option. A shrink evicts the policy's least valuable residents and returns
their memory; a grow adds empty slots; background reads land before the banks change. The
cache needs one slot to serve a layer call (its misses then go one at a time), so a size
under one expert is clamped to one slot, and above the pool to the pool; the result says so."""
from __future__ import annotations

GiB = 1 << 30


def host_cache_backend(engine):
    """The disk tier's experts backend, or None (the pool is in memory: no host cache)."""
    experts = engine.model.experts
    experts = getattr(experts, "inner", experts)            # record_routing wraps the backend
    return experts if experts is not None and hasattr(experts, "resize_host_cache") else None


def host_cache_size(engine) -> dict | None:
    disk = host_cache_backend(engine)
    if disk is None:
        return None
    c = disk.cache
    return {"bytes": c.capacity * disk.layout.expert_nbytes, "slots": c.capacity, "resident": c.resident,
            "expert_bytes": disk.layout.expert_nbytes, "device": "host"}


def resize_host_cache(engine, nbytes: int) -> dict | None:
    """Resize to `nbytes` (checked by the caller: a number in range); None without a disk tier."""
    disk = host_cache_backend(engine)
    if disk is None:
        return None
    S = disk.layout.expert_nbytes
    n_total = disk.layout.num_layers * disk.layout.num_experts
    before = disk.cache.capacity
    slots = nbytes // S
    clamped = ""
    if slots < 1:
        slots, clamped = 1, (f"host_cache_gib: {nbytes / GiB:g} GiB is less than one expert "
                             f"({S / 2**20:.2f} MiB); kept 1 slot, the least a layer call needs")
    elif slots > n_total:
        slots, clamped = n_total, f"capped at the whole pool ({n_total} experts)"
    resident_before = disk.cache.resident
    kept = disk.resize_host_cache(slots) if slots != before else resident_before
    return {"before": before * S, "after": slots * S, "slots_before": before, "slots_after": slots,
            "evicted": resident_before - kept, "clamped": clamped}
