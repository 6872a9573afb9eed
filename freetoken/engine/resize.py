"""Elastic memory: the engine's expert cache, KV pool and checkpoint budget, resized between
steps (`LLMEngine.resize_memory`). The engine is single-threaded, so a call from its owning
thread is by construction a safe point: no forward pass, no copy in flight.

Each component shrinks by evicting before it frees, and none changes an output:
  expert cache   least valuable residents leave (the cache rebuilds keeping the most recent);
                 misses are filled or run on the CPU, the same experts either way
  state budget   least recently used checkpoints are dropped (a later request recomputes)
  KV pool        kv_resize.py: unreferenced prefix blocks, then preemption, then compaction
  host cache     the disk tier's RAM cache (experts/disk/backend.py): the policy's least valuable
                 residents leave, their memory goes back; background reads land first
Sizes are GiB like the options that set them at start (expert_cache_gib, kv_cache_gib,
state_cache_gib, host_cache_gib); None leaves a component as it is."""
from __future__ import annotations

import logging
import time

from ..config import check_gib
from ..errors import InvalidRequestError
from .kv_resize import resize_kv
from ..memory.probe import probe

log = logging.getLogger("freetoken.engine")
GiB = 1 << 30
COMPONENTS = ("expert_cache", "kv_cache", "state_cache", "host_cache")


def memory_sizes(engine) -> dict:
    """Current bytes of every resizable component (None where the engine has none)."""
    experts = engine.model.experts
    blocks = engine.blocks
    return {
        "expert_cache": experts.cache_size() if experts is not None else None,
        # blocks as /metrics counts them: the null block left out, tree-only blocks cached
        "kv_cache": {"bytes": engine.runner.kv_nbytes, "blocks": blocks.num_usable,
                     "blocks_in_use": blocks.num_held_by_requests, "blocks_cached": blocks.reclaimable,
                     "block_size": blocks.block_size,
                     "device": str(engine.runner.device)},
        "state_cache": {"bytes": engine.prefix.state_budget, "used_bytes": engine.prefix.checkpoint_bytes,
                        "checkpoints": engine.prefix.num_checkpoints, "device": "host"},
        "host_cache": experts.host_cache_size() if experts is not None else None,
    }


def _gib(name: str, value, most: int | None = None) -> int | None:
    """Bytes of a GiB size, checked before anything is resized (a bad one changes nothing).
    most: the bytes this machine has for it (above: an error, not an allocation attempt)."""
    check_gib(name, value)
    if value is None:
        return None
    n = round(value * GiB)     # nearest byte: k experts' GiB (k * S / 2**30) must not come back 1 short
    if most and n > most:
        raise InvalidRequestError(f"{name}: {value:g} GiB is more than this machine's memory "
                                  f"({most / GiB:.1f} GiB)")
    return n


def _host_total() -> int | None:
    return probe("cpu").host_total or None


def resize_memory(engine, *, expert_cache_gib=None, kv_cache_gib=None, state_cache_gib=None,
                  host_cache_gib=None, allow_preempt: bool = True, trigger: str = "api") -> dict:
    """Resize now (the caller owns the engine thread, so this is between steps). Returns, per
    component changed, {"before": bytes, "after": bytes, ...details}."""
    want = {"expert_cache": _gib("expert_cache_gib", expert_cache_gib),
            "kv_cache": _gib("kv_cache_gib", kv_cache_gib),
            "state_cache": _gib("state_cache_gib", state_cache_gib,
                                _host_total() if state_cache_gib is not None else None),
            "host_cache": _gib("host_cache_gib", host_cache_gib,
                               _host_total() if host_cache_gib is not None else None)}
    t0 = time.perf_counter()
    done: dict = {}
    before = memory_sizes(engine)
    if want["expert_cache"] is not None:
        done["expert_cache"] = _resize_experts(engine, want["expert_cache"])
    if want["host_cache"] is not None:
        done["host_cache"] = _resize_host_cache(engine, want["host_cache"])
    if want["state_cache"] is not None:
        dropped = engine.prefix.set_state_budget(want["state_cache"])
        done["state_cache"] = {"before": before["state_cache"]["bytes"], "after": engine.prefix.state_budget,
                               "dropped_checkpoints": dropped}
    if want["kv_cache"] is not None:
        per_block = max(1, engine.runner.kv_nbytes // engine.blocks.num_blocks)
        r = resize_kv(engine, max(2, want["kv_cache"] // per_block), allow_preempt=allow_preempt)
        done["kv_cache"] = {"before": before["kv_cache"]["bytes"], "after": engine.runner.kv_nbytes,
                            "blocks_before": r.blocks_before - 1, "blocks_after": r.blocks_after - 1,
                            "evicted_blocks": r.evicted_blocks, "preempted": r.preempted,
                            "moved_blocks": r.moved_blocks, "clamped": r.clamped}
    seconds = time.perf_counter() - t0
    parts = []
    for name, d in done.items():
        if d is None or d["before"] == d["after"]:
            continue
        extra = ", ".join(f"{k} {v}" for k, v in d.items() if k not in ("before", "after") and v)
        parts.append(f"{name} {_size(d['before'])} -> {_size(d['after'])}" + (f" ({extra})" if extra else ""))
    if parts:                                              # one line per resize
        log.info("memory resize (%s) in %.1f ms: %s", trigger, seconds * 1e3, "; ".join(parts))
    return {"trigger": trigger, "seconds": seconds, "components": done}


def _size(n: int) -> str:
    return f"{n / GiB:.3f} GiB" if n >= GiB else f"{n / 2**20:.1f} MiB"


def _resize_experts(engine, nbytes: int) -> dict | None:
    experts = engine.model.experts          # resident / cpu / disk backends: no cache to size (None)
    return experts.resize_cache_bytes(nbytes) if experts is not None else None


def _resize_host_cache(engine, nbytes: int) -> dict | None:
    experts = engine.model.experts          # no disk tier (the pool is in RAM): no host cache (None)
    return experts.resize_host_cache_bytes(nbytes) if experts is not None else None
