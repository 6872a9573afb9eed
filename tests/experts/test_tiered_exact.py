"""Every backend at every cache size gives the resident answer (fp32, up to summation order),
at the Experts seam, through prefill streaming, decode splits, waves, background fills and
elastic resizes."""
import numpy as np
import pytest
import torch
from tiered_helpers import make_pool, random_step, reference, torch_host, one_torch_thread  # noqa: F401

from freetoken.experts.measure.bandwidth import BandwidthEstimator
from freetoken.experts.memory.pool import ExpertPool, ExpertSpec
from freetoken.experts.execution.tiered import CpuExperts, TieredExperts
from freetoken.experts.memory.transfer import PacedCopyEngine, SyncCopyEngine, ThreadCopyEngine

L, E, K = 3, 8, 2
CPU = torch.device("cpu")


def run_and_compare(be, pool, steps=6, seed=0, tol=2e-5, prefill_tokens=12, hot=None, between=None,
                    dtype=torch.float32):
    ref = reference(pool)
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        if between is not None:
            between(be, step)
        phase = "prefill" if step == 0 else "decode"
        be.begin_step(phase)
        T = prefill_tokens if step == 0 else 1 + step % 3
        for layer in range(pool.num_layers):
            x, ids, w = random_step(pool, T, K, g, hot=hot)
            x, w = x.to(dtype), w.to(dtype)
            got = be.forward(layer, x, ids, w)
            want = ref.forward(layer, x, ids, w)
            assert got.dtype == x.dtype and got.shape == x.shape
            torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
        if isinstance(be, TieredExperts):
            be.cache.check()
            assert not be.cache.locks[~be.cache.pending].any(), "a slot stayed locked after the step"
    return be.stats()


@pytest.mark.parametrize("policy", ["offload", "hybrid"])
@pytest.mark.parametrize("slots", [0, 1, 3, E, 2 * E, L * E])
def test_tiered_equals_resident(policy, slots):
    pool = make_pool(L, E)
    be = TieredExperts(pool, CPU, slots, policy, copy_engine=ThreadCopyEngine(), host_executor=torch_host(pool))
    st = run_and_compare(be, pool)
    tot = st["total"]
    assert tot["hits"] + tot["misses"] > 0
    assert st["cache"]["resident"] <= slots
    if slots == 0:
        assert tot["fills"] == 0 and tot["cpu_experts"] == tot["misses"]
    if slots >= 2 * E:
        assert tot["streamed_layers"] == L            # the prompt streamed whole layers
    if policy == "offload" and slots > 1:
        assert tot["cpu_experts"] == 0                # every miss filled (in waves if need be), every
        #                                               prefetch in flight waited for (the default prefetches)
    # (one slot: a prefetched expert the call routes is a hit that holds the only slot for the call,
    # so the call's other misses find no victim and run on the CPU: decision.py's overflow)
    be.close()


def test_cpu_backend_equals_resident():
    pool = make_pool(L, E)
    st = run_and_compare(CpuExperts(pool, CPU, torch_host(pool)), pool)
    assert st["total"]["cpu_experts"] > 0


@pytest.mark.parametrize("policy,slots", [("cpu", 0), ("hybrid", 0), ("hybrid", 5), ("offload", 2 * E)])
def test_with_the_fast_cpu_kernels(policy, slots):
    pool = make_pool(L, E, hidden=32, inter=32)
    be = CpuExperts(pool, CPU) if policy == "cpu" else TieredExperts(pool, CPU, slots, policy)
    run_and_compare(be, pool, steps=4, tol=1e-4)
    be.close()


@pytest.mark.parametrize("b_p,b_h", [(1e6, 1e11), (5e9, 1e10), (1e11, 1e10)])
def test_hybrid_any_split_is_exact(b_p, b_h):
    """Slow link (background fills), balanced, and fast link (all fills)."""
    pool = make_pool(L, E, seed=3)
    est = BandwidthEstimator(b_p, b_h, online=False)
    be = TieredExperts(pool, CPU, 5, "hybrid", estimator=est, host_executor=torch_host(pool), guard=False,
                       copy_engine=PacedCopyEngine(pool.expert_nbytes / 2e-3))   # 2 ms per expert
    st = run_and_compare(be, pool, steps=8, hot=4)
    if b_p < b_h / 100:
        assert st["total"]["warm_fills"] > 0 and st["total"]["fill_fraction"] == 0   # decode never waits on the link
    be.close()


@pytest.mark.parametrize("q", [1, 2, 3])
def test_fixed_q(q):
    pool = make_pool(L, E, seed=4)
    be = TieredExperts(pool, CPU, 6, "hybrid", copy_engine=SyncCopyEngine(), host_executor=torch_host(pool))
    be.planner.fixed_q = q
    run_and_compare(be, pool, steps=5)
    be.close()


def test_elastic_resize_between_steps():
    pool = make_pool(L, E, seed=5)
    be = TieredExperts(pool, CPU, 4, "hybrid", copy_engine=ThreadCopyEngine(), host_executor=torch_host(pool))
    sizes = {2: 20, 3: 0, 4: 7, 5: 24}
    run_and_compare(be, pool, steps=7, between=lambda b, s: s in sizes and b.resize_cache(sizes[s]))
    assert be.cache.capacity == 24
    be.close()


def test_bias_and_clamped_swiglu():
    pool = make_pool(L, E, bias=True, activation="swiglu_oai", seed=6)
    for slots in (0, 3, 2 * E):
        be = TieredExperts(pool, CPU, slots, "hybrid", copy_engine=ThreadCopyEngine(), host_executor=torch_host(pool))
        run_and_compare(be, pool, steps=4)
        be.close()


def _quantized_pool(fmt):
    from freetoken.experts.formats import quantize_banks
    H = I = 32
    g = torch.Generator().manual_seed(7)
    gu = torch.randn(L * E, 2 * I, H, generator=g) / H ** 0.5
    dn = torch.randn(L * E, H, I, generator=g) / I ** 0.5
    if fmt == "bf16":
        return ExpertPool({"gate_up": gu.bfloat16(), "down": dn.bfloat16()}, L, E, ExpertSpec(H, I))
    return ExpertPool(quantize_banks(gu, dn, fmt), L, E, ExpertSpec(H, I, fmt=fmt))


@pytest.mark.parametrize("fmt", ["mxfp4", "ggml", "bf16"])
def test_other_formats(fmt):
    pool = _quantized_pool(fmt)
    for slots in (0, 5, 2 * E):
        be = TieredExperts(pool, CPU, slots, "hybrid", copy_engine=ThreadCopyEngine(), host_executor=torch_host(pool))
        run_and_compare(be, pool, steps=4, tol=1e-2 if fmt == "bf16" else 1e-5,
                        dtype=torch.bfloat16 if fmt == "bf16" else torch.float32)
        be.close()


def test_stats_are_consistent():
    pool = make_pool(L, E)
    be = TieredExperts(pool, CPU, 5, "hybrid", copy_engine=ThreadCopyEngine(), host_executor=torch_host(pool))
    st = run_and_compare(be, pool, steps=5)
    tot = st["total"]
    assert len(st["per_layer"]) == L
    assert tot["hits"] == sum(p["hits"] for p in st["per_layer"])
    assert tot["bytes_copied"] == (tot["fills"] + tot["warm_fills"] + tot["prefetches"]) * pool.expert_nbytes
    assert tot["cpu_bytes"] == tot["cpu_experts"] * pool.expert_nbytes
    assert 0.0 <= tot["hit_rate"] <= 1.0
    assert st["steps"] == {"prefill": 1, "decode": 4}
    assert {"b_p_gbs", "b_h_gbs"} <= set(st["bandwidth"])
    be.close()


def test_inflight_expert_runs_on_the_cpu():
    """An expert whose background fill has not landed is served from the host pool."""
    pool = make_pool(1, 4, hidden=64, inter=64)
    link = PacedCopyEngine(pool.expert_nbytes / 0.2)                     # 200 ms per expert
    be = TieredExperts(pool, CPU, 2, "hybrid", copy_engine=link, host_executor=torch_host(pool), guard=False,
                       estimator=BandwidthEstimator(1e6, 1e12, online=False))
    ref = reference(pool)
    x = torch.randn(1, 64)
    w = torch.ones(1, 1)
    be.begin_step("decode")
    torch.testing.assert_close(be.forward(0, x, torch.tensor([[2]]), w), ref.forward(0, x, torch.tensor([[2]]), w))
    assert be.cache.pending.any()
    torch.testing.assert_close(be.forward(0, x, torch.tensor([[2]]), w), ref.forward(0, x, torch.tensor([[2]]), w))
    assert be.stats()["total"]["cpu_experts"] == 2
    be.cache.drain()
    be.forward(0, x, torch.tensor([[2]]), w)
    assert be.stats()["total"]["hits"] == 1
    be.close()
    assert np.all(be.cache.locks == 0)


def test_prefill_streams_the_next_layer_during_this_one():
    """Double buffering: while layer l computes, all of layer l+1 is already on its way into
    the cache (installed, locked), and at most two layers are borrowed."""
    pool = make_pool(L, E)
    seen = []

    def device(banks, spec, ids, x, w, out=None):
        c = be.cache
        layer = int(c.owner[int(ids[ids >= 0][0])]) // E
        nxt = np.arange((layer + 1) * E, (layer + 2) * E) if layer + 1 < L else np.empty(0, np.int64)
        seen.append((layer, bool((c.slot_of[nxt] >= 0).all()), int((c.locks > 0).sum())))
        from freetoken.experts.execution.torch_exec import run_experts
        return run_experts(banks, spec, ids, x, w, out=out)

    be = TieredExperts(pool, CPU, 2 * E + 3, "hybrid", copy_engine=ThreadCopyEngine(),
                       host_executor=torch_host(pool), device_executor=device)
    run_and_compare(be, pool, steps=1, prefill_tokens=16)
    assert [s[0] for s in seen] == list(range(L))
    assert all(prefetched for layer, prefetched, _ in seen if layer + 1 < L)
    assert max(locked for *_, locked in seen) <= 2 * E
    assert be.stats()["total"]["streamed_layers"] == L
    be.close()


def test_prefill_without_room_for_two_layers_falls_back_to_on_demand():
    pool = make_pool(L, E)
    be = TieredExperts(pool, CPU, 2 * E - 1, "offload", copy_engine=ThreadCopyEngine(), host_executor=torch_host(pool))
    st = run_and_compare(be, pool, steps=2, prefill_tokens=16)
    assert st["total"]["streamed_layers"] == 0 and st["total"]["fills"] > 0
    be.close()
