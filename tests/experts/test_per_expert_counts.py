"""Per-(layer, expert) counters (the web page's heat map): on every backend path each sums
over the experts to the per-layer count /metrics exports, and hits + fills + CPU runs of an
expert equal the layer calls that routed it (counted here from the routing itself)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from tiered_helpers import make_pool, random_step, torch_host, one_torch_thread  # noqa: F401

from freetoken.experts.measure.bandwidth import BandwidthEstimator
from freetoken.experts.execution.tiered import CpuExperts, TieredExperts
from freetoken.experts.memory.transfer import SyncCopyEngine

L, E, K = 3, 8, 2
CPU = torch.device("cpu")


def drive(be, steps=10, prefill_tokens=12, seed=3):
    """Run steps; -> [L, E] layer calls that routed each expert (decode steps only when the
    prefill streams whole layers)."""
    g = torch.Generator().manual_seed(seed)
    routed = np.zeros((L, E), np.int64)
    for step in range(steps):
        phase = "prefill" if step == 0 else "decode"
        be.begin_step(phase, prefill_tokens if step == 0 else 1)
        T = prefill_tokens if step == 0 else 1 + step % 3
        for layer in range(L):
            x, ids, w = random_step(make_pool.pool, T, K, g, hot=5)
            be.forward(layer, x, ids, w)
            routed[layer, np.unique(ids.numpy())] += 1
    return routed


def check(st, routed=None):
    pe = {k: np.array(v) for k, v in st["per_expert"].items()}
    for key in ("hits", "fills", "cpu_experts"):
        assert pe[key].shape == (L, E)
        assert pe[key].sum(1).tolist() == [row[key] for row in st["per_layer"]], key
        assert pe[key].sum() == st["total"][key]
    if routed is not None:
        np.testing.assert_array_equal(pe["hits"] + pe["fills"] + pe["cpu_experts"], routed)


@pytest.fixture
def pool():
    make_pool.pool = make_pool(L, E, seed=1)
    return make_pool.pool


@pytest.mark.parametrize("policy", ["offload", "hybrid"])
@pytest.mark.parametrize("device", [False, True], ids=["host-decides", "device-decides"])
@pytest.mark.parametrize("slots", [4, 12])
def test_tiered_per_expert_counts(pool, policy, device, slots):
    be = TieredExperts(pool, CPU, slots, policy, cache_policy="lru", host_executor=torch_host(pool),
                       copy_engine=SyncCopyEngine(), guard=False, device_decisions=device,
                       stream_prefill=False, estimator=BandwidthEstimator(1e9, 3e9, online=False))
    routed = drive(be)
    st = be.stats()
    assert st["total"]["fills"] > 0
    if slots > 2 * 5:              # room for more than two layers' hot experts: some hits
        assert st["total"]["hits"] > 0
    if policy == "hybrid":
        assert st["total"]["cpu_experts"] > 0
    check(st, routed)
    be.close()


def test_streamed_prefill_counts_whole_layer_fills(pool):
    be = TieredExperts(pool, CPU, 2 * E, "hybrid", cache_policy="lru", host_executor=torch_host(pool),
                       copy_engine=SyncCopyEngine(), guard=False, stream_prefill=True,
                       estimator=BandwidthEstimator(1e9, 3e9, online=False))
    drive(be, steps=1, prefill_tokens=64)
    st = be.stats()
    if not st["total"]["streamed_layers"]:
        pytest.skip("the streamer chose on-demand prefill for this size")
    check(st)
    be.close()


def test_cpu_backend_per_expert_counts(pool):
    be = CpuExperts(pool, CPU, torch_host(pool))
    routed = drive(be)
    st = be.stats()
    check(st, routed)
    np.testing.assert_array_equal(np.array(st["per_expert"]["cpu_experts"]), routed)


def test_metrics_leave_the_per_expert_lists_out(pool):
    from freetoken.server.operations.metrics import flatten
    be = CpuExperts(pool, CPU, torch_host(pool))
    drive(be, steps=2)
    names = {n for n, _ in flatten(be.stats())}
    assert "layer_cpu_experts" in names and not any("per_expert" in n for n in names)
