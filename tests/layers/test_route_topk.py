"""The decode step's routing in one C call (kernels/c/router.c) against torch's softmax / topk /
renormalisation, on random logits (no ties), every shape a router has."""
from __future__ import annotations

import pytest
import torch

from freetoken import kernels
from freetoken.layers.moe import SparseMoE


@pytest.mark.parametrize("isa", kernels.variants_here())
def test_route_topk_matches_torch(isa):
    lib = kernels.load(isa)
    g = torch.Generator().manual_seed(torch.seed() % (2**31))
    for t, e, k in ((1, 8, 2), (3, 64, 8), (17, 128, 8), (64, 48, 8), (5, 256, 1), (2, 32, 32)):
        logits = torch.randn(t, e, generator=g) * 3
        for norm, after in ((1, 0), (0, 0), (0, 1)):
            ids = torch.empty(t, k, dtype=torch.int64)
            w = torch.empty(t, k)
            lib.ft_route_topk(logits.data_ptr(), t, e, k, norm, after, ids.data_ptr(), w.data_ptr())
            if after:
                top, ref_ids = torch.topk(logits, k, dim=-1)
                ref_w = torch.softmax(top, dim=-1)
            else:
                ref_w, ref_ids = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
                if norm:
                    ref_w = ref_w / ref_w.sum(-1, keepdim=True)
            assert torch.equal(ids, ref_ids), (t, e, k, norm, after)
            torch.testing.assert_close(w, ref_w, rtol=2e-6, atol=1e-7)


def test_sparse_moe_routes_through_c_for_decode_and_torch_for_prefill():
    """The same answer from both paths of SparseMoE.route (the C call for <= 64 rows)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(16, 32, generator=g)
    moe = SparseMoE(0, lambda x: x @ w.T, None, top_k=4, norm_topk_prob=True)
    x = torch.randn(70, 32, generator=g)
    ids_small, w_small = moe.route(x[:5])
    ids_big, w_big = moe.route(x)
    assert torch.equal(ids_small, ids_big[:5])
    torch.testing.assert_close(w_small, w_big[:5], rtol=2e-6, atol=1e-7)
