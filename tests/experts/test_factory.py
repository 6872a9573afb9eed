"""Backend choice, cache sizing and profile loading from the engine options."""
import dataclasses

import torch
from tiered_helpers import make_pool, one_torch_thread  # noqa: F401

from freetoken.config import EngineConfig
from freetoken.experts.measure.bandwidth import BandwidthProfile, device_id, format_id, machine_id, save_profile
from freetoken.memory.resolve import unplanned
from freetoken.loading.experts_backend import backend_choice, build_experts, cache_choice
from freetoken.experts.execution.resident import ResidentExperts
from freetoken.experts.execution.tiered import CpuExperts, TieredExperts

CPU = torch.device("cpu")


def cfg(**kw):
    return EngineConfig(model="x", **kw)


def chosen(pool, c, device=CPU):
    """Settings as the engine has them when no plan was made: the backend by the one rule."""
    return dataclasses.replace(unplanned(c), **backend_choice(pool, c, device))


def test_backend_choice_and_cache_size():
    pool = make_pool(layers=2, experts=8)
    n, S = 16, pool.expert_nbytes

    def slots(device="cpu", room=None, **kw):
        return cache_choice(cfg(moe_backend="hybrid", **kw), device, n, S, 8, room)[1]
    assert cache_choice(cfg(), "cpu", n, S, 8, None) == ("cpu", 0)      # no CUDA: the pure-CPU backend
    assert isinstance(build_experts(pool, cfg(), CPU, chosen(pool, cfg()))[0], CpuExperts)
    resident = cfg(moe_backend="resident")
    assert isinstance(build_experts(pool, resident, CPU, chosen(pool, resident))[0], ResidentExperts)
    assert slots(expert_cache_slots=5) == 5
    assert slots(expert_cache_slots=500) == 16
    assert slots(expert_cache_gib=3 * S / 2**30) == 3
    assert slots() == 16                                                 # host tier default: >= two layers
    # CUDA: what the room holds after the KV reserve; auto is resident only when all of it fits
    kv = 2**30
    assert slots("cuda", kv + 5 * S + 7, kv_cache_gib=1) == 5
    assert cache_choice(cfg(kv_cache_gib=1), "cuda", n, S, 8, kv + 5 * S) == ("hybrid", 5)
    assert cache_choice(cfg(kv_cache_gib=1), "cuda", n, S, 8, kv + 16 * S) == ("resident", 16)


def test_profile_drives_the_estimator(tmp_path):
    pool = make_pool(layers=2, experts=8)
    path = tmp_path / "bw.json"
    save_profile(path, BandwidthProfile(b_p=3e9, b_h=12e9, machine=machine_id(), device=device_id(CPU),
                                        fmt=format_id(pool)))
    c = cfg(moe_backend="hybrid", expert_cache_slots=4, bandwidth_profile=str(path))
    be, _ = build_experts(pool, c, CPU, chosen(pool, c))
    assert isinstance(be, TieredExperts) and be.cache.capacity == 4
    assert abs(be.est.b_p - 3e9) < 1 and abs(be.est.b_h - 12e9) < 1
    be.close()


def test_cache_size_decided_at_the_first_step():
    """On CUDA the default size is read from free VRAM once the other weights are loaded."""
    from tiered_helpers import random_step, reference, torch_host
    pool = make_pool(layers=2, experts=8)
    be = TieredExperts(pool, CPU, lambda: 5, "hybrid", host_executor=torch_host(pool))
    assert be.cache.capacity == 0
    x, ids, w = random_step(pool, 2, 2, torch.Generator().manual_seed(0))
    torch.testing.assert_close(be.forward(1, x, ids, w), reference(pool).forward(1, x, ids, w))
    assert be.cache.capacity == 5
    be.close()
