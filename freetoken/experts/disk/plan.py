"""The memory plan's part for the disk tier (called from memory/plan.py).

Rule: on a host-memory engine the expert pool is served from the model file when the
options say so (`expert_tier=disk`, or a host cache size given), or, with `expert_tier=auto`,
when pool + dense weights exceed the host budget (host memory after the OS reserve;
on CUDA the dense weights count as 0 there). The host cache then gets the explicit size,
else defaults.HOST_CACHE_SHARE of what the budget leaves after the dense weights (the rest stays for
the KV cache, activations and the OS), at least one expert per MoE layer, at most the pool.
The plan shows the pool on "disk" (not counted) and the cache on "host", with one line."""
from __future__ import annotations

from dataclasses import dataclass

from ... import defaults

GiB = 2**30


@dataclass
class DiskTier:
    slots: int
    nbytes: int
    line: str | None          # the plan's one line when the tier turned on by itself


def disk_tier(cfg, n_experts: int, moe_layers: int, S: int, pool: int, dense: int, budget: int) -> DiskTier | None:
    """None: the pool is loaded into RAM. Else the host cache's size (slots, bytes)."""
    if n_experts == 0:
        return None
    forced = cfg.disk_tier
    if not forced and not (cfg.expert_tier == "auto" and pool + dense > budget):
        return None
    slots = host_cache_slots(cfg, n_experts, moe_layers, S, None if forced else max(0, budget - dense))
    line = None if forced else (
        f"experts: the pool ({pool / GiB:.2f} GiB) and dense weights ({dense / GiB:.2f} GiB) do not fit "
        f"{budget / GiB:.2f} GiB; experts are read from the model file into a host cache of "
        f"{slots * S / GiB:.2f} GiB ({slots} of {n_experts} experts)")
    return DiskTier(slots, slots * S, line)


def host_cache_slots(cfg, n_experts: int, moe_layers: int, S: int, room: int | None = None) -> int:
    """Slots of the host cache: host_cache_slots, else host_cache_gib, else HOST_CACHE_SHARE of
    `room` (host budget after the dense weights; the tier turned on by itself), else (forced
    with no size, or no room known) HOST_CACHE_FORCED_SHARE of the pool; at least one expert per MoE layer unless a
    size is given, at most the pool."""
    if cfg.host_cache_slots is not None:
        slots = cfg.host_cache_slots
    elif cfg.host_cache_gib is not None:
        slots = int(cfg.host_cache_gib * GiB // S)
    elif room is None:
        slots = int(n_experts * defaults.HOST_CACHE_FORCED_SHARE)
    else:
        slots = int(defaults.HOST_CACHE_SHARE * room // S)
    floor = 1 if (cfg.host_cache_slots or cfg.host_cache_gib) else moe_layers    # auto: one per layer
    return min(n_experts, max(floor, slots))
