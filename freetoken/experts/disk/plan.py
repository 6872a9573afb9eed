"""The memory plan's part for the disk tier (called from memory/plan.py).

Rule: on a host-memory engine the expert pool is served from the model file when the
options say so (`expert_tier=disk`, or a host cache size given), or, with `expert_tier=auto`,
when pool + dense weights exceed the host budget (host memory after the OS reserve;
on CUDA the dense weights count as 0 there). The host cache then gets the explicit size,
else defaults.HOST_CACHE_SHARE of what the budget leaves after the dense weights (the rest stays for
the KV cache, activations and the OS), at least one expert per MoE layer, at most the pool.
The plan shows the pool on "disk" (not counted) and the cache on "host", with one line.

Hard limits (a memory cgroup, v1 or v2, memory/probe.py; else the machine's memory): what
the process holds past one is an OOM kill, not a slowdown. So a host cache whose size was
given (host_cache_gib / host_cache_slots) and does not fit under the limit beside the dense
weights and the process's own floor (`PROCESS_FLOOR`: Python, torch, the kernels, KV and
activations of a short context) is refused in one line; the forced tier's default size (a
share of the pool) is shrunk to what fits in the budget (the limit less the headroom) beside the dense
weights and that floor (the auto tier's is a share of the budget, which
the headroom already keeps under the limit); `expert_tier=ram` with a pool that cannot fit under a cgroup limit is refused."""
from __future__ import annotations

from dataclasses import dataclass

from ... import defaults
from ...errors import FreeTokenError

GiB = 2**30
# measured: an engine process with a tiny MoE model peaks at 0.36 GiB RSS (python, torch, the C
# kernels, max_model_len 1024); about twice that leaves a real model's KV and activations room
PROCESS_FLOOR = int(0.75 * GiB)


class MemoryLimitError(FreeTokenError, ValueError):
    """What the options ask for cannot fit under the machine's (or the cgroup's) memory limit."""


@dataclass
class DiskTier:
    slots: int
    nbytes: int
    line: str | None          # the plan's one line when the tier turned on by itself


def disk_tier(cfg, n_experts: int, moe_layers: int, S: int, pool: int, dense: int, budget: int,
              limit: int | None = None, limit_source: str = "MemTotal") -> DiskTier | None:
    """None: the pool is loaded into RAM. Else the host cache's size (slots, bytes). `limit`:
    the host memory the process may ever hold (probe's host_total), from `limit_source`."""
    if n_experts == 0:
        return None
    forced = cfg.disk_tier
    if not forced and not (cfg.expert_tier == "auto" and pool + dense > budget):
        if limit is not None and limit_source == "cgroup limit" and pool + dense + PROCESS_FLOOR > limit:
            raise MemoryLimitError(
                f"expert_tier=ram: the expert pool ({pool / GiB:.2f} GiB) and dense weights ({dense / GiB:.2f} GiB) "
                f"cannot fit under the {limit_source} of {limit / GiB:.2f} GiB; use expert_tier=disk or auto")
        return None
    sized = cfg.host_cache_slots is not None or cfg.host_cache_gib is not None
    slots = host_cache_slots(cfg, n_experts, moe_layers, S, None if forced else max(0, budget - dense))
    line = None if forced else (
        f"experts: the pool ({pool / GiB:.2f} GiB) and dense weights ({dense / GiB:.2f} GiB) do not fit "
        f"{budget / GiB:.2f} GiB; experts are read from the model file into a host cache of "
        f"{slots * S / GiB:.2f} GiB ({slots} of {n_experts} experts)")
    room = None if limit is None else limit - dense - PROCESS_FLOOR
    if forced and not sized:      # a default size: within the budget (the headroom kept), not only the limit
        room = min(budget, limit if limit is not None else budget) - dense - PROCESS_FLOOR
    if room is not None and slots * S > room and (sized or forced):      # (auto: sized from the budget already)
        if sized:
            raise MemoryLimitError(
                f"host_cache_gib: a host cache of {slots * S / GiB:.2f} GiB ({slots} experts) and the dense "
                f"weights ({dense / GiB:.2f} GiB) cannot fit under the {limit_source} of {limit / GiB:.2f} GiB "
                f"(the process needs ~{PROCESS_FLOOR / GiB:.2f} GiB besides); at most "
                f"{max(0, room) / GiB:.2f} GiB fits")
        fit = max(1, min(slots, max(0, room) // S))
        line = (f"experts: a host cache of {slots * S / GiB:.2f} GiB does not fit in the {budget / GiB:.2f} GiB "
                f"budget ({limit_source} {(limit or budget) / GiB:.2f} GiB less the headroom) beside the dense "
                f"weights ({dense / GiB:.2f} GiB); shrunk to "
                f"{fit * S / GiB:.2f} GiB ({fit} of {n_experts} experts)")
        slots = fit
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
