"""A decode step's MoE block after the router GEMV in one C call (`ft_moe_decode`,
`SparseMoE._fused`, `CpuExperts.forward_logits`): the bits of the five-call path it replaces
(route top-k, ids + layer offset, zeros, the experts run) on every model family whose MoE layers
take it, every kernel build this CPU runs; and torch's float64 softmax / top-k / expert MLPs
within fp32 tolerance."""
from __future__ import annotations

import pytest
import torch

from freetoken import LLM, kernels
from freetoken.experts.execution.torch_exec import run_experts
from freetoken.layers import moe as moe_mod
from freetoken.layers.moe import SparseMoE
from freetoken.tiny import make_tiny

ARCHS = ("qwen3_moe", "mixtral", "olmoe", "gpt_oss", "qwen2_moe")


@pytest.fixture
def five_call():
    def run(f):
        moe_mod.FUSED[0] = False
        try:
            return f()
        finally:
            moe_mod.FUSED[0] = True
    return run


@pytest.mark.parametrize("isa", kernels.variants_here())
@pytest.mark.parametrize("arch", ARCHS)
def test_fused_moe_decode_is_the_five_call_path(tmp_path, arch, isa, five_call):
    path = make_tiny(arch, tmp_path / arch, layers=2, hidden=64, experts=8, top_k=2)
    llm = LLM(str(path), moe_backend="cpu", kernel_isa=isa, num_threads=2)
    try:
        model = llm.engine.model
        layers = [l.mlp for l in model.layers if isinstance(l.mlp, SparseMoE)]
        assert layers, arch
        g = torch.Generator().manual_seed(1)
        calls = []
        backend = model.experts
        orig = backend.forward_logits
        backend.forward_logits = lambda *a: calls.append(1) or orig(*a)
        for moe in layers:
            seen = []
            prev = moe.on_route            # the routing hooks (the speculative counters) see the same routes
            moe.on_route = lambda layer, ids, w, prev=prev: seen.append((layer, ids.clone(), w.clone())) or (
                prev and prev(layer, ids, w))
            for rows in (1, 2, 4):                    # a decode step, a verify's few rows (<= 64 pairs)
                x = torch.randn(rows, model.hidden, generator=g)
                fused = moe(x)
                ref = five_call(lambda: moe(x))
                assert torch.equal(fused, ref), (arch, isa, rows)
                (l1, i1, w1), (l2, i2, w2) = seen[-2:]
                assert l1 == l2 and torch.equal(i1, i2) and torch.equal(w1, w2)
            moe.on_route = None           # without a hook: the scratch buffers
            x = torch.randn(1, model.hidden, generator=g)
            assert torch.equal(moe(x), five_call(lambda: moe(x)))
            moe.on_route = prev
        assert calls and all(calls), "the fused call never ran"
        stats = backend.stats()
        assert stats, "expert stats still kept"
    finally:
        llm.close()


def test_fused_moe_decode_matches_float64_torch(tmp_path):
    """Routing and experts against torch in float64 (softmax, top-k, renormalised weights, the
    experts' MLPs from the pool's banks). The bf16 dots off: where calibration turns them on, the
    experts' intermediate row is rounded to bf16, and a float32 vs float64 difference flips one
    rounding (1.05e-5 on Zen 4); the bf16 path's bits are the five-call test's."""
    path = make_tiny("qwen3_moe", tmp_path / "m", layers=1, hidden=64, experts=8, top_k=2)
    llm = LLM(str(path), moe_backend="cpu", num_threads=2, bf16_dot="off")
    try:
        model = llm.engine.model
        moe = model.layers[0].mlp
        pool = model.experts.pool
        x = torch.randn(3, model.hidden, generator=torch.Generator().manual_seed(2))
        out = moe(x)
        logits = moe.router(x).double()
        p = torch.softmax(logits, -1)
        w, ids = torch.topk(p, moe.top_k, -1)
        if moe.norm:
            w = w / w.sum(-1, keepdim=True)
        ref = run_experts(pool.banks, pool.spec, ids + moe.moe_layer * pool.num_experts, x.double(), w,
                          dtype=torch.float64)
        torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)
    finally:
        llm.close()
