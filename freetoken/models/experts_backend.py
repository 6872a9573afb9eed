"""Choose and build the experts backend from the engine options.

  resident  every expert on the execution device (no cache)
  offload   slot cache on the device, every miss filled
  hybrid    slot cache, misses split between fills and the CPU by q* (planner.py)
  cpu       every routed expert on the CPU from the host pool
  auto      CUDA: resident when the pool fits the cache budget, else hybrid;
            no CUDA: cpu (a cache tier in host memory would only add copies)
"""
from __future__ import annotations

import logging

import torch

from .. import defaults
from ..config import EngineConfig
from ..experts.bandwidth import BandwidthEstimator, DEFAULT_PROFILE, device_id, format_id, load_profile, machine_id
from ..experts.base import Experts
from ..experts.disk import DiskExperts
from ..experts.host_exec import make_host_executor
from ..experts.pinning import pin_or_pageable
from ..experts.pool import ExpertPool
from ..experts.recording import RoutingRecorder
from ..experts.resident import ResidentExperts
from ..experts.slots import DEFAULT_POLICY
from ..experts.tiered import CpuExperts, TieredExperts
from ..experts.transfer import make_copy_engine
from ..kernels.choices import kernel_variant
from ..kernels.pool import SPIN_US
from .disk_layout import disk_layout

log = logging.getLogger("freetoken.experts")


def cache_slots(pool: ExpertPool, cfg: EngineConfig, device: torch.device, non_expert_bytes: int = 0) -> int:
    """Slots of the expert cache: expert_cache_slots, else expert_cache_gib, else (CUDA) the free
    VRAM after non-expert weights and a KV reserve, else (host tier) a quarter of the pool.
    On CUDA without an explicit size, the backend calls this at its first step, when the
    non-expert weights are already on the device."""
    n, S = pool.num_layers * pool.num_experts, pool.expert_nbytes
    if cfg.expert_cache_slots is not None:
        return max(0, min(n, cfg.expert_cache_slots))
    if cfg.expert_cache_gib is not None:
        return max(0, min(n, int(cfg.expert_cache_gib * 2**30 // S)))
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        # the memory plan writes kv_cache_gib; the default is for a config built without one
        kv = (cfg.kv_cache_gib if cfg.kv_cache_gib is not None else defaults.KV_CACHE_GIB) * 2**30
        budget = free - non_expert_bytes - kv - defaults.DEVICE_HEADROOM_GIB * 2**30
        return max(0, min(n, int(budget // S)))
    return defaults.expert_cache_slots(n, pool.num_experts)


def resolve_backend(pool: ExpertPool, cfg: EngineConfig, device: torch.device, non_expert_bytes: int = 0) -> str:
    if cfg.moe_backend != "auto":
        return cfg.moe_backend
    if device.type != "cuda":
        return "cpu"
    fits = cache_slots(pool, cfg, device, non_expert_bytes) >= pool.num_layers * pool.num_experts
    return "resident" if fits else "hybrid"


def build_experts(pool: ExpertPool, cfg: EngineConfig, device: torch.device, non_expert_bytes: int = 0,
                  spin_us: int = SPIN_US, pin=None) -> Experts:
    """non_expert_bytes: device bytes the engine will still allocate for non-expert weights (CUDA
    `auto` needs it to know whether the pool fits; the cache itself is sized at the first step).
    pin: the call that page-locks the pool (default `pool.pin` on CUDA, nothing elsewhere; tests
    pass a fake to take the fallback on any device).
    The result's `settings` say which backend and how many cache slots were chosen."""
    device = torch.device(device)
    backend = resolve_backend(pool, cfg, device, non_expert_bytes)
    pinned = True
    if backend in ("offload", "hybrid") and (pin is not None or device.type == "cuda" and not _pinned(pool)):
        pinned = pin_or_pageable(pin or pool.pin)
    if backend == "resident":
        experts: Experts = ResidentExperts(pool, device)
    elif backend == "cpu":
        experts = CpuExperts(pool, device, _host_executor(pool, cfg, spin_us))
    else:
        prof = load_profile(cfg.bandwidth_profile or DEFAULT_PROFILE, machine_id(), device_id(device), format_id(pool))
        if prof is None and cfg.bandwidth_profile:
            log.warning("no bandwidth profile for this machine/device/format in %s; estimating online",
                        cfg.bandwidth_profile)
        policy = cfg.expert_cache_policy or DEFAULT_POLICY
        sized = cfg.expert_cache_slots is not None or cfg.expert_cache_gib is not None or device.type != "cuda"
        slots = cache_slots(pool, cfg, device) if sized else (lambda: cache_slots(pool, cfg, device))
        experts = TieredExperts(pool, device, slots, backend if pinned else "pageable", cache_policy=policy,
                                host_executor=_host_executor(pool, cfg, spin_us),
                                copy_engine=make_copy_engine(device, pinned=pinned),
                                estimator=BandwidthEstimator.from_profile(prof, device))
    settings = {"moe_backend": backend, "expert_cache_slots": None}
    if not pinned:
        settings["pinned"] = False          # misses on the CPU, hits on the device
    if backend in ("offload", "hybrid"):
        settings["expert_cache_slots"] = slots if isinstance(slots, int) else "sized at the first step"
        settings["expert_cache_policy"] = policy
    if cfg.record_routing:
        experts = RoutingRecorder(experts, cfg.record_routing,
                                  {"num_layers": pool.num_layers, "num_experts": pool.num_experts,
                                   "model": cfg.model, "expert_bytes": pool.expert_nbytes})
    experts.settings = settings
    return experts


def _host_executor(pool: ExpertPool, cfg: EngineConfig, spin_us: int):
    return make_host_executor(pool, cfg.num_threads, spin_us=spin_us, isa=kernel_variant(cfg.kernel_isa))


def _pinned(pool: ExpertPool) -> bool:
    return all(b.is_pinned() for b in pool.all_banks())


def host_cache_slots(expert_nbytes: int, n: int, cfg: EngineConfig, num_experts: int) -> int:
    """Slots of the disk tier's host cache: host_cache_slots, else host_cache_gib, else (forced
    with no size) half the pool; at least one."""
    if cfg.host_cache_slots is not None:
        return max(1, min(n, cfg.host_cache_slots))
    if cfg.host_cache_gib is not None:
        return max(1, min(n, int(cfg.host_cache_gib * 2**30 // expert_nbytes)))
    return max(1, min(n, max(2 * num_experts, n // 2)))


def build_disk_experts(model, ck, cfg: EngineConfig, spin_us: int = SPIN_US):
    """The disk tier (experts/disk.py): (layout of the experts in the file, backend)."""
    layout = disk_layout(model, ck, cfg)
    n = layout.num_layers * layout.num_experts
    slots = host_cache_slots(layout.expert_nbytes, n, cfg, layout.num_experts)
    device = torch.device(cfg.torch_device)
    prof = load_profile(cfg.bandwidth_profile or DEFAULT_PROFILE, machine_id(), device_id(device), format_id(layout))
    experts = DiskExperts(layout, device, slots, cfg.expert_cache_policy,
                          num_threads=cfg.num_threads, spin_us=spin_us, b_d=prof.b_d if prof is not None else None)
    log.info("experts: disk tier, %.2f GiB pool in %s, host cache %d of %d experts (%.2f GiB), B_D %s",
             layout.nbytes / 2**30, layout.paths[0].name, slots, n, slots * layout.expert_nbytes / 2**30,
             f"{experts.b_d / 1e9:.2f} GB/s" if experts.b_d else "not profiled (prefetch unbounded)")
    if cfg.record_routing:                  # the trace the in-memory backends write
        experts = RoutingRecorder(experts, cfg.record_routing, {"num_layers": layout.num_layers,
                                  "num_experts": layout.num_experts, "model": cfg.model,
                                  "expert_bytes": layout.expert_nbytes})
    experts.settings = {"moe_backend": "cpu", "expert_cache_slots": None, "expert_tier": "disk",
                        "host_cache_slots": slots}
    return layout, experts
