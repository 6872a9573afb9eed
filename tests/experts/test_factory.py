"""Backend choice, cache sizing and profile loading from the engine options."""
import torch
from tiered_helpers import make_pool, one_torch_thread  # noqa: F401

from freetoken.config import EngineConfig
from freetoken.experts.bandwidth import BandwidthProfile, device_id, format_id, machine_id, save_profile
from freetoken.models.experts_backend import build_experts, cache_slots, resolve_backend
from freetoken.experts.resident import ResidentExperts
from freetoken.experts.tiered import CpuExperts, TieredExperts

CPU = torch.device("cpu")


def cfg(**kw):
    return EngineConfig(model="x", **kw)


def test_backend_choice_and_cache_size():
    pool = make_pool(layers=2, experts=8)
    assert resolve_backend(pool, cfg(), CPU) == "cpu"                 # no CUDA: the pure-CPU backend
    assert isinstance(build_experts(pool, cfg(), CPU), CpuExperts)
    assert isinstance(build_experts(pool, cfg(moe_backend="resident"), CPU), ResidentExperts)
    assert cache_slots(pool, cfg(expert_cache_slots=5), CPU) == 5
    assert cache_slots(pool, cfg(expert_cache_slots=500), CPU) == 16
    assert cache_slots(pool, cfg(expert_cache_gib=3 * pool.expert_nbytes / 2**30), CPU) == 3
    assert cache_slots(pool, cfg(), CPU) == 16                        # host tier default: >= two layers


def test_profile_drives_the_estimator(tmp_path):
    pool = make_pool(layers=2, experts=8)
    path = tmp_path / "bw.json"
    save_profile(path, BandwidthProfile(b_p=3e9, b_h=12e9, machine=machine_id(), device=device_id(CPU),
                                        fmt=format_id(pool)))
    be = build_experts(pool, cfg(moe_backend="hybrid", expert_cache_slots=4, bandwidth_profile=str(path)), CPU)
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
