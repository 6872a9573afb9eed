"""The device decision path of `offload` / `hybrid` (issue 23, items 1 and 3), forced on the CPU:
the same numbers as `resident`, the same cache statistics as the host planner, and the host
synchronisations of a decode MoE layer counted (0 in offload, 1 in hybrid)."""
from __future__ import annotations

import pytest
import torch
from test_tiered_exact import run_and_compare
from helpers import CountHostSyncs
from tiered_helpers import make_pool, random_step, torch_host, one_torch_thread  # noqa: F401

from freetoken.experts.execution import device_path
from freetoken.experts.measure.bandwidth import BandwidthEstimator
from freetoken.experts.execution.tiered import TieredExperts
from freetoken.experts.memory.transfer import SyncCopyEngine

L, E, K = 3, 8, 2
CPU = torch.device("cpu")


def tiered(pool, slots, policy, device, b=(6e9, 1e10)):
    return TieredExperts(pool, CPU, slots, policy, cache_policy="lru", host_executor=torch_host(pool),
                         copy_engine=SyncCopyEngine(), guard=False, device_decisions=device,
                         estimator=BandwidthEstimator(*b, online=False))


@pytest.mark.parametrize("policy", ["offload", "hybrid"])
@pytest.mark.parametrize("slots", [3, 7, 2 * E, L * E])
def test_device_decisions_give_the_resident_answer(policy, slots):
    pool = make_pool(L, E)
    be = tiered(pool, slots, policy, True)
    st = run_and_compare(be, pool, steps=8)
    assert st["total"]["hits"] + st["total"]["misses"] > 0
    be.close()


@pytest.mark.parametrize("policy,b", [("offload", (6e9, 1e10)), ("hybrid", (6e9, 1e10)), ("hybrid", (1e9, 3e10))])
def test_device_and_host_decisions_count_the_same(policy, b):
    pool = make_pool(L, E, seed=2)
    stats = []
    for device in (False, True):
        be = tiered(pool, 9, policy, device, b)
        run_and_compare(be, pool, steps=10, seed=4, hot=5)
        st = be.stats()
        stats.append({k: st["total"][k] for k in ("hits", "misses", "fills", "cpu_experts")})
        stats.append(be.cache.lru_order())
        be.close()
    assert stats[0] == stats[2] and stats[1] == stats[3]


def test_ggml_and_lfu_keep_the_host_planner():
    pool = make_pool(L, E)
    be = TieredExperts(pool, CPU, 9, "offload", cache_policy="lfu", host_executor=torch_host(pool),
                       copy_engine=SyncCopyEngine(), device_decisions=True)
    run_and_compare(be, pool, steps=3)
    assert be._devpath is None
    be.close()


@pytest.mark.parametrize("policy,syncs", [("offload", 0), ("hybrid", 1)])
def test_host_syncs_per_decode_moe_layer(policy, syncs):
    pool = make_pool(L, E, hidden=32, inter=32)
    be = tiered(pool, 12, policy, True, (1e9, 3e10))
    g = torch.Generator().manual_seed(0)
    be.begin_step("prefill")
    for layer in range(L):
        be.forward(layer, *random_step(pool, 4, K, g))
    for step in range(4):
        be.begin_step("decode")
        for layer in range(L):
            x, ids, w = random_step(pool, 2, K, g)
            before = device_path.HOST_COPIES["n"]
            with CountHostSyncs() as mode:
                be.forward(layer, x, ids, w)
            assert mode.ops == [], mode.ops                 # no host read of device data
            assert device_path.HOST_COPIES["n"] - before == syncs   # the one packed copy in hybrid
    st = be.stats()["total"]
    assert st["hits"] + st["misses"] > 0 and (st["cpu_experts"] > 0) == (policy == "hybrid")
    be.close()
