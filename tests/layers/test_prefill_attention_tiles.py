"""Causal prefill attention on AMX tiles and with vdpbf16ps (kernels/c/prefill_attention.c, each
mode this CPU runs) against float64 attention with the explicit causal mask, over the same bf16 inputs: prompts and chunks continuing a cached
prefix, odd lengths, GQA ratios, head dims 64/128, keys strided as the paged gather leaves them;
and through `paged_attention` with the tiles switched on and off.

Tolerance: the scores are exact bf16 products summed in fp32 and the softmax is fp32, but the
numerators are rounded to bf16 (relative error <= 2^-9) before P x V, so an output is off by at
most 2^-9 x max|v| from that rounding (the rounded weights' errors sum to <= 2^-9 of their sum);
twice that covers the fp32 sums and the exp polynomial (~2e-7 relative)."""
import pytest
import torch
import torch.nn.functional as F

from freetoken.kernels import load
from freetoken.kernels.pool import CpuPool
from freetoken.layers.attention import prefill
from freetoken.layers.attention.paged import paged_attention
from tests.helpers import paged_mixed_step


MODES = {"amx": 1, "vdpbf16ps": 2}     # ft_set_prefill_att's codes


@pytest.fixture(scope="module", params=list(MODES))
def pool(request):
    lib = load("native")
    mode = MODES[request.param]
    if lib is None or lib.ft_set_prefill_att(mode) != mode:
        pytest.skip(f"{request.param} does not run here (AMX: amx_bf16 and the OS's grant of the tile state; "
                    "vdpbf16ps: avx512_bf16)")
    p = CpuPool(lib, 2)
    p.mode = mode
    yield p
    lib.ft_set_prefill_att(0)
    p.close()


def reference(q, k, v, scale):
    """q [1, Hq, Q, D] at the last Q of K positions; float64, the causal mask written out."""
    nq, nk = q.shape[2], k.shape[2]
    mask = torch.arange(nk)[None, :] <= torch.arange(nk - nq, nk)[:, None]
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask, scale=scale,
                                          enable_gqa=True)


def bound(v):
    return 2 * 2.0 ** -9 * v.abs().max().item()


@pytest.mark.parametrize("hq,hkv,d,nq,nk", [(1, 1, 64, 1, 1), (8, 2, 64, 37, 37), (4, 4, 128, 2, 2),
                                            (32, 4, 128, 97, 97), (16, 4, 128, 300, 300), (6, 3, 64, 45, 1000),
                                            (8, 1, 128, 129, 645), (4, 2, 64, 700, 701), (2, 1, 64, 1100, 1100)])
def test_tiles_match_float64_causal_attention(pool, hq, hkv, d, nq, nk):
    g = torch.Generator().manual_seed(7 * nk + nq)
    q, k, v = (torch.randn(1, h, n, d, generator=g).bfloat16() for h, n in ((hq, nq), (hkv, nk), (hkv, nk)))
    out = prefill.tiles_chunk(pool, q, k, v, d ** -0.5)
    assert out is not None and out.dtype == torch.float32
    assert (out.double() - reference(q, k, v, d ** -0.5)).abs().max() <= bound(v)


def test_keys_strided_as_the_gather_leaves_them_and_a_wide_score_range(pool):
    """keys/values as views of [K, Hkv, D] rows (the paged gather's layout), queries a transposed
    [Q, Hq, D], the output written into a strided fp32 view; scores spread over hundreds."""
    g = torch.Generator().manual_seed(5)
    hq, hkv, d, nq, nk = 8, 2, 128, 70, 300
    rows_k, rows_v = (torch.randn(nk, hkv, d, generator=g).bfloat16() for _ in range(2))
    q = (4 * torch.randn(nq, hq, d, generator=g)).bfloat16().transpose(0, 1)[None]
    k, v = rows_k.transpose(0, 1)[None], rows_v.transpose(0, 1)[None]
    out = torch.zeros(1, hq, nq + 5, d)
    assert prefill.tiles_chunk(pool, q, k, v, 0.5, out[:, :, :nq]) is not None
    assert (out[:, :, :nq].double() - reference(q, k, v, 0.5)).abs().max() <= bound(v)
    assert not out[:, :, nq:].any()


def test_what_the_tiles_do_not_run_falls_back(pool):
    q = torch.randn(1, 4, 5, 40).bfloat16()              # head dim 40: not a multiple of 32
    assert prefill.tiles_chunk(pool, q, q[:, :2], q[:, :2], 0.1) is None
    assert prefill.tiles_chunk(pool, q.float(), q[:, :2].float(), q[:, :2].float(), 0.1) is None


@pytest.mark.parametrize("on", [True, False])
def test_paged_prefill_with_the_tiles_on_and_off(pool, on):
    """Both choices through paged_attention (chunks over a cached prefix, a fresh prompt, a decode
    token) against float64 masked attention over the cache's bf16 keys."""
    g = torch.Generator().manual_seed(11)
    hq, hkv, d = 8, 2, 64
    cache, meta, n = paged_mixed_step(g, hkv, d, torch.bfloat16, [(0, 50), (700, 130), (999, 1)])
    meta.kernel_pool = pool
    q = torch.randn(n, hq, d, generator=g)
    k, v = torch.randn(n, hkv, d, generator=g), torch.randn(n, hkv, d, generator=g)
    pool.lib.ft_set_prefill_att(pool.mode if on else 0)
    try:
        out = paged_attention(q, k, v, cache, meta, d ** -0.5, prefill_dtype=torch.bfloat16)
    finally:
        pool.lib.ft_set_prefill_att(pool.mode)
    for i, (qi, pos) in enumerate(zip(meta.query_index, meta.query_positions)):
        nq, nk = int((pos >= 0).sum()), int(meta.context_lens[i])
        keys = cache.k[meta.key_slots[i, :nk]].transpose(0, 1)[None]
        vals = cache.v[meta.key_slots[i, :nk]].transpose(0, 1)[None]
        ref = reference(q[qi[:nq]].bfloat16().transpose(0, 1)[None], keys, vals, d ** -0.5)
        # torch's kernel rounds its output to bf16 too: twice the bound, plus half an ulp of it
        assert (out[qi[:nq]].transpose(0, 1)[None].double() - ref).abs().max() <= 2 * bound(vals) + 2.0 ** -8
