"""Blockwise causal prefill attention (no [q, k] mask) against float64 SDPA with the explicit mask,
up to long contexts, and through `paged_attention` for mixed prefill/decode batches."""
import pytest
import torch
import torch.nn.functional as F

from freetoken.layers.attention import prefill as prefill_attention
from freetoken.layers.attention.paged import paged_attention
from tests.helpers import paged_mixed_step

pytestmark = pytest.mark.skipif(not prefill_attention.available(), reason="torch without CPU flash attention")


def _reference(q, k, v, scale):
    """q [1, Hq, Q, D] at the last Q of K positions; float64 SDPA with the causal mask."""
    nq, nk = q.shape[2], k.shape[2]
    mask = torch.arange(nk)[None, :] <= torch.arange(nk - nq, nk)[:, None]
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask, scale=scale,
                                          enable_gqa=True)


@pytest.mark.parametrize("hq,hkv,d,nq,nk", [(8, 2, 64, 37, 37), (8, 2, 64, 64, 16384), (6, 6, 40, 129, 700),
                                            (4, 1, 128, 300, 2100), (4, 2, 32, 1, 50)])
def test_causal_chunk_matches_masked_sdpa(hq, hkv, d, nq, nk):
    g = torch.Generator().manual_seed(nk + nq)
    q, k, v = (torch.randn(1, h, n, d, generator=g) for h, n in ((hq, nq), (hkv, nk), (hkv, nk)))
    out = prefill_attention.causal_chunk(q, k, v, d ** -0.5)
    torch.testing.assert_close(out.double(), _reference(q, k, v, d ** -0.5), atol=2e-5, rtol=1e-4)


def test_bf16_multiplication_stays_close():
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(1, 8, 100, 64, generator=g), torch.randn(1, 2, 4000, 64, generator=g), \
        torch.randn(1, 2, 4000, 64, generator=g)
    kb, vb = k.bfloat16(), v.bfloat16()
    out = prefill_attention.causal_batch(q, kb, vb, [100], [4000], 0.125, torch.bfloat16)
    assert out.dtype == torch.float32
    ref = _reference(q.bfloat16(), kb, vb, 0.125)
    assert (out.double() - ref).abs().max() < 2e-2


def test_paged_attention_mixed_batch_matches_the_mask_path():
    """Two prefill chunks (one continuing a cached prefix) and a decode token in one step: the
    blockwise path equals the masked SDPA path of the same metadata (padded queries aside)."""
    g = torch.Generator().manual_seed(3)
    hq, hkv, d = 8, 2, 32
    cache, meta, off = paged_mixed_step(g, hkv, d, torch.float32, [(0, 50), (700, 130), (999, 1)])
    q = torch.randn(off, hq, d, generator=g)
    k, v = torch.randn(off, hkv, d, generator=g), torch.randn(off, hkv, d, generator=g)
    out = paged_attention(q, k, v, cache, meta, d ** -0.5)
    meta.context_lens = None                               # forces the masked SDPA path
    ref = paged_attention(q, k, v, cache, meta, d ** -0.5)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
