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
from ..config import EngineConfig, Settings
from ..experts.measure.bandwidth import BandwidthEstimator, DEFAULT_PROFILE, device_id, format_id, load_profile, machine_id
from ..experts.base import Experts
from ..experts.disk.backend import DiskExperts
from ..experts.disk.lookahead import model_routes
from ..experts.measure.diskbw import THREADS as DISK_THREADS
from ..experts.disk.plan import host_cache_slots
from ..experts.execution.host_exec import make_host_executor
from ..experts.memory.pinning import pin_or_pageable
from ..experts.memory.pool import ExpertPool
from ..experts.measure.recording import RoutingRecorder
from ..experts.execution.resident import ResidentExperts
from ..experts.memory.slots import DEFAULT_POLICY, slots_in
from ..experts.execution.tiered import CpuExperts, TieredExperts
from ..experts.memory.transfer import make_copy_engine
from ..kernels.choices import kernel_variant
from ..kernels.pool import SPIN_US
from .disk_layout import disk_layout

log = logging.getLogger("freetoken.experts")


def cache_choice(cfg: EngineConfig, device_type: str, n: int, S: int, experts_per_layer: int,
                 room: int | None) -> tuple[str, int]:
    """(backend, cache slots) the options ask for, before the memory plan reduces anything: the
    one rule, read by the plan (memory/plan.py, with its estimate of the room) and by
    `backend_choice` when no plan could be made (with the free VRAM it measures).
    Slots: expert_cache_slots, else expert_cache_gib, else (CUDA) what `room` (device bytes left
    after the non-expert weights) holds after a KV reserve, else (host tier) a quarter of the
    pool. `auto` is resident on CUDA when the whole pool fits, hybrid when not, cpu elsewhere."""
    backend = cfg.moe_backend
    if backend == "auto" and device_type != "cuda":
        backend = "cpu"
    if n == 0 or backend == "cpu":
        return backend, 0
    if cfg.expert_cache_slots is not None:
        slots = max(0, min(n, cfg.expert_cache_slots))
    elif cfg.expert_cache_gib is not None:
        slots = slots_in(int(cfg.expert_cache_gib * 2**30), S, n)
    elif device_type == "cuda":
        kv = (cfg.kv_cache_gib if cfg.kv_cache_gib is not None else defaults.KV_CACHE_GIB) * 2**30
        slots = max(0, min(n, int(((room or 0) - kv) // S)))
    else:
        slots = defaults.expert_cache_slots(n, experts_per_layer)
    if backend == "auto":
        backend = "resident" if slots >= n else "hybrid"
    if backend == "resident":
        slots = n if device_type == "cuda" else 0     # on the CPU the resident pool is the host pool itself
    return backend, slots


def backend_choice(pool: ExpertPool, cfg: EngineConfig, device: torch.device) -> dict:
    """The Settings fields of the experts backend when no plan chose one (settings made without a
    plan: a config the plan could not read): `cache_choice`, the one rule, with the room measured
    now (CUDA: free VRAM less the headroom; the loader builds the experts after the model's dense
    weights, so they are already in place)."""
    room = None
    if device.type == "cuda" and cfg.expert_cache_slots is None and cfg.expert_cache_gib is None:
        free, _ = torch.cuda.mem_get_info(device)
        room = free - int(defaults.DEVICE_HEADROOM_GIB * 2**30)
    backend, slots = cache_choice(cfg, device.type, pool.num_layers * pool.num_experts, pool.expert_nbytes,
                                  pool.num_experts, room)
    tiered = backend in ("offload", "hybrid")
    return dict(moe_backend=backend, expert_cache_slots=slots if tiered else None,
                expert_cache_policy=(cfg.expert_cache_policy or DEFAULT_POLICY) if tiered else None)


def build_experts(pool: ExpertPool, cfg: EngineConfig, device: torch.device, settings: Settings,
                  spin_us: int = SPIN_US, pin=None) -> tuple[Experts, dict]:
    """The backend `settings` chose (memory/resolve.py; `backend_choice` where no plan could).
    pin: the call that page-locks the pool (default `pool.pin` on CUDA, nothing elsewhere; tests
    pass a fake to take the fallback on any device).
    Returns the backend and what building found out (Settings fields: `pinned` False), for the
    start-up table."""
    device = torch.device(device)
    backend, slots, policy = settings.moe_backend, settings.expert_cache_slots, settings.expert_cache_policy
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
        experts = TieredExperts(pool, device, slots, backend if pinned else "pageable",
                                cache_policy=policy or DEFAULT_POLICY,
                                host_executor=_host_executor(pool, cfg, spin_us),
                                copy_engine=make_copy_engine(device, pinned=pinned),
                                estimator=BandwidthEstimator.from_profile(prof, device))
    found = {} if pinned else {"pinned": False}     # misses on the CPU, hits on the device
    if cfg.record_routing:
        experts = RoutingRecorder(experts, cfg.record_routing,
                                  {"num_layers": pool.num_layers, "num_experts": pool.num_experts,
                                   "model": cfg.model, "expert_bytes": pool.expert_nbytes})
    return experts, found


def _host_executor(pool: ExpertPool, cfg: EngineConfig, spin_us: int):
    return make_host_executor(pool, cfg.num_threads, spin_us=spin_us, isa=kernel_variant(cfg.kernel_isa))


def _pinned(pool: ExpertPool) -> bool:
    return all(b.is_pinned() for b in pool.all_banks())


def build_disk_experts(model, ck, cfg: EngineConfig, spin_us: int = SPIN_US, settings: Settings | None = None):
    """The disk tier (experts/disk/backend.py): (layout of the experts in the file, backend, what building
    found out), with the host cache `settings` sized (without settings, by the plan's rule on the
    options alone)."""
    layout = disk_layout(model, ck, cfg)
    n = layout.num_layers * layout.num_experts
    slots = settings.host_cache_slots if settings is not None and settings.host_cache_slots else \
        host_cache_slots(cfg, n, layout.num_layers, layout.expert_nbytes)
    device = torch.device(cfg.torch_device)
    prof = load_profile(cfg.bandwidth_profile or DEFAULT_PROFILE, machine_id(), device_id(device), format_id(layout))
    io_threads = cfg.disk_io_threads or (prof.disk_queue_depth if prof is not None else None) or DISK_THREADS
    experts = DiskExperts(layout, device, slots, cfg.expert_cache_policy,
                          num_threads=cfg.num_threads, spin_us=spin_us, b_d=prof.b_d if prof is not None else None,
                          io_threads=io_threads, lookahead=cfg.expert_lookahead, direct_io=cfg.disk_direct_io)
    experts.attach_routes(model_routes(model))
    log.info("experts: disk tier, %.2f GiB pool in %s, host cache %d of %d experts (%.2f GiB), B_D %s",
             layout.nbytes / 2**30, layout.paths[0].name, slots, n, slots * layout.expert_nbytes / 2**30,
             f"{experts.b_d / 1e9:.2f} GB/s" if experts.b_d else "not profiled (prefetch unbounded)")
    if cfg.record_routing:                  # the trace the in-memory backends write
        experts = RoutingRecorder(experts, cfg.record_routing, {"num_layers": layout.num_layers,
                                  "num_experts": layout.num_experts, "model": cfg.model,
                                  "expert_bytes": layout.expert_nbytes})
    planned = settings is not None and settings.host_cache_slots
    found = {} if planned else {"moe_backend": "cpu", "expert_tier": "disk", "host_cache_slots": slots}
    return layout, experts, found
