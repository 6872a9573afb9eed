"""The device decision path on a real CUDA device (skipped without one; nothing here has run on
a GPU yet): device-side fills from the pinned pool, the decision kernels, the batched slot
executor, the one packed device->host copy of hybrid and its event, host syncs counted."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from test_device_path import CountHostSyncs
from test_tiered_exact import run_and_compare
from tiered_helpers import make_pool, random_step, torch_host, one_torch_thread  # noqa: F401

from freetoken.experts.execution import device_path
from freetoken.experts.measure.bandwidth import BandwidthEstimator
from freetoken.experts.memory.device_plan import DeviceLRU
from freetoken.experts.formats import quantize_banks
from freetoken.experts.memory.pool import ExpertPool, ExpertSpec
from freetoken.experts.execution.tiered import TieredExperts
from freetoken.experts.execution.torch_exec import run_slots
from freetoken.experts.memory.transfer import make_copy_engine
from freetoken.experts.memory.uva import device_rows

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CUDA = torch.device("cuda")
L, E, K = 3, 8, 2


def pinned_pool(**kw) -> ExpertPool:
    pool = make_pool(L, E, **kw)
    pool.banks = {k: b.pin_memory() for k, b in pool.banks.items()}
    return pool


def test_device_reads_pinned_pool_rows():
    bank = torch.randn(24, 16, 8).bfloat16().pin_memory()
    idx = torch.tensor([3, 0, 23, 3], device=CUDA)
    rows = device_rows(bank, CUDA).index_select(0, idx)
    assert rows.device.type == "cuda"
    want = bank.view(torch.uint8).reshape(24, -1)[idx.cpu()]
    assert torch.equal(rows.cpu(), want)


def test_device_rows_refuse_pageable_banks():
    with pytest.raises(ValueError, match="pinned"):
        device_rows(torch.zeros(4, 4), CUDA)


def test_decisions_on_cuda_equal_those_on_the_cpu():
    g = torch.Generator().manual_seed(0)
    a, b = DeviceLRU(L * E, 9, torch.device("cpu")), DeviceLRU(L * E, 9, CUDA)
    for call in range(60):
        flat = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(3)]) + (call % L) * E
        pa, pb = a.plan(flat, "hybrid", 1e9, 3e9), b.plan(flat.to(CUDA), "hybrid", 1e9, 3e9)
        for x, y in ((pa.slot_ids, pb.slot_ids), (pa.cpu_ids, pb.cpu_ids), (pa.counts, pb.counts)):
            assert torch.equal(x, y.cpu())
        a.land(), b.land()
    assert torch.equal(a.slot_of, b.slot_of.cpu()) and torch.equal(a.stamp, b.stamp.cpu())


@pytest.mark.parametrize("fmt", ["bf16", "int8", "mxfp4"])
def test_slot_executor_on_cuda_equals_the_cpu(fmt):
    g = torch.Generator().manual_seed(1)
    H = I = 64
    banks = quantize_banks(torch.randn(6, 2 * I, H, generator=g) * 0.1, torch.randn(6, H, I, generator=g) * 0.1, fmt)
    spec = ExpertSpec(H, I, "float" if fmt == "bf16" else fmt)
    ids = torch.tensor([[0, 5], [2, -1], [5, 1]])
    x, w = torch.randn(3, H, generator=g), torch.rand(3, 2, generator=g)
    want = run_slots(banks, spec, ids, x, w, torch.zeros(3, 2, H))
    got = run_slots({k: v.to(CUDA) for k, v in banks.items()}, spec, ids.to(CUDA), x.to(CUDA), w.to(CUDA),
                    torch.zeros(3, 2, H, device=CUDA))
    assert ((got.cpu() - want).abs().max() / want.abs().max()) <= 1e-5


@pytest.mark.parametrize("policy", ["offload", "hybrid"])
def test_tiered_on_cuda_decides_on_the_device_and_gives_the_resident_answer(policy):
    pool = pinned_pool()
    be = TieredExperts(pool, CUDA, 12, policy, cache_policy="lru", host_executor=torch_host(pool),
                       copy_engine=make_copy_engine(CUDA), guard=False,
                       estimator=BandwidthEstimator(1e9, 3e10, online=False))
    assert be._want_device                          # chosen by default on CUDA
    ref = make_pool(L, E)                           # the same seed: the same experts
    g = torch.Generator().manual_seed(3)
    from tiered_helpers import reference
    r = reference(ref)
    be.begin_step("decode")
    for layer in range(L):
        x, ids, w = random_step(pool, 2, K, g)
        got = be.forward(layer, x.to(CUDA), ids.to(CUDA), w.to(CUDA))
        torch.testing.assert_close(got.cpu(), r.forward(layer, x, ids, w), atol=2e-5, rtol=2e-5)
    assert be._devpath is not None and be._devpath.active
    be.close()


@pytest.mark.parametrize("policy,copies", [("offload", 0), ("hybrid", 1)])
def test_cuda_host_syncs_per_decode_moe_layer(policy, copies):
    pool = pinned_pool(hidden=32, inter=32)
    be = TieredExperts(pool, CUDA, 12, policy, cache_policy="lru", host_executor=torch_host(pool),
                       copy_engine=make_copy_engine(CUDA), guard=False,
                       estimator=BandwidthEstimator(1e9, 3e10, online=False))
    g = torch.Generator().manual_seed(0)
    be.begin_step("decode")
    for layer in range(L):
        x, ids, w = (t.to(CUDA) for t in random_step(pool, 2, K, g))
        be.forward(layer, x, ids, w)                    # warm-up: state moved to the device
    be.begin_step("decode")
    for layer in range(L):
        x, ids, w = (t.to(CUDA) for t in random_step(pool, 2, K, g))
        before = device_path.HOST_COPIES["n"]
        with CountHostSyncs() as mode:
            be.forward(layer, x, ids, w)
        assert device_path.HOST_COPIES["n"] - before == copies
        assert mode.ops == ["d2h"] * copies, mode.ops       # only the packed CPU work list
    be.close()
    assert np.all(be.cache.locks == 0)
