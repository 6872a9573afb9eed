"""The decode step's short cuts (issue 38: the step's fixed cost) give what the general paths
give: a few tokens' q/k norms + rope in one buffer (rope.norm_rope_qk) and the residual add +
norm in one call (norm.add_rms_norm) against float64 reference math and the per-tensor calls;
the KV rows stored by one C call against torch's conversion and index copy; a GGUF embedding's rows by the C dequantizer against the gguf
package's dequantization, in every kernel variant this CPU runs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken import kernels
from freetoken.kernels.pool import CpuPool
from freetoken.layers.ggml_linear import KERNEL_TYPES, GgmlEmbedding, GgmlWeight
from freetoken.layers.attention.paged import KVCache, write_rows_c
from freetoken.layers.norm import RMSNorm, add_rms_norm
from freetoken.layers.rope import Rotary, norm_rope_qk
from freetoken.quant import ggml_quants as gq
from freetoken.quant.ggml_iquants import TYPES as I_QUANTS

pytestmark = pytest.mark.skipif(kernels.cpu_kernels() is None, reason="no C kernels here")


def rms64(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return w.double() * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope64(x: torch.Tensor, pos: int, rot: int, theta: float) -> torch.Tensor:
    """NeoX-halves rotation of the first `rot` features at position `pos`, in float64."""
    inv = 1.0 / theta ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    ang = pos * inv
    c, s = torch.cat([ang.cos(), ang.cos()]), torch.cat([ang.sin(), ang.sin()])
    r, rest = x[..., :rot].double(), x[..., rot:].double()
    half = rot // 2
    rotated = torch.cat([-r[..., half:], r[..., :half]], -1)
    return torch.cat([r * c + rotated * s, rest], -1)


@pytest.mark.parametrize("head_dim,partial", [(64, 1.0), (32, 0.5)])
@pytest.mark.parametrize("normed", [True, False])
@pytest.mark.parametrize("n", [1, 3])          # a decode step's token, a verify's 1 + 2 drafted
def test_norm_rope_qk_is_the_reference(head_dim, partial, normed, n):
    gen = torch.Generator().manual_seed(head_dim + normed + 10 * n)
    heads, kv_heads, pos, theta = 4, 2, 37, 10000.0
    cfg = {"rope_theta": theta, "partial_rotary_factor": partial, "max_position_embeddings": 128}
    rotary = Rotary(cfg, head_dim, 128, torch.float32, "cpu")
    cos, sin = rotary.tables(torch.arange(pos, pos + n))
    qkv = torch.randn(n, (heads + 2 * kv_heads) * head_dim, generator=gen)
    norms = (RMSNorm(torch.rand(head_dim, generator=gen) + 0.5, 1e-6),
             RMSNorm(torch.rand(head_dim, generator=gen) + 0.5, 1e-6)) if normed else (None, None)
    q, k = norm_rope_qk(qkv, heads, kv_heads, head_dim, rotary.dim, *norms, cos, sin)
    for t in range(n):
        q_in = qkv[t:t + 1, :heads * head_dim].reshape(1, heads, head_dim)
        k_in = qkv[t:t + 1, heads * head_dim:(heads + kv_heads) * head_dim].reshape(1, kv_heads, head_dim)
        if normed:
            q_in, k_in = rms64(q_in, norms[0].weight, 1e-6), rms64(k_in, norms[1].weight, 1e-6)
        torch.testing.assert_close(q[t:t + 1].double(), rope64(q_in, pos + t, rotary.dim, theta), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(k[t:t + 1].double(), rope64(k_in, pos + t, rotary.dim, theta), rtol=1e-5, atol=1e-5)
    # the very values of the per-tensor path it replaces (the same C calls), and of one token alone
    q_ref = qkv[:, :heads * head_dim].reshape(n, heads, head_dim)
    k_ref = qkv[:, heads * head_dim:(heads + kv_heads) * head_dim].reshape(n, kv_heads, head_dim)
    if normed:
        q_ref, k_ref = norms[0](q_ref), norms[1](k_ref)
    assert torch.equal(q, rotary.apply(q_ref, cos, sin)) and torch.equal(k, rotary.apply(k_ref, cos, sin))
    q1, k1 = norm_rope_qk(qkv[-1:].clone(), heads, kv_heads, head_dim, rotary.dim, *norms, cos[-1:], sin[-1:])
    assert torch.equal(q[-1:], q1) and torch.equal(k[-1:], k1)


def test_norm_rope_qk_declines_what_it_does_not_cover():
    rotary = Rotary({"rope_theta": 10000.0}, 16, 8, torch.float32, "cpu")
    cos, sin = rotary.tables(torch.tensor([1]))
    qkv = torch.randn(2, 4 * 16)
    assert norm_rope_qk(torch.randn(4 * 16, 2).t(), 2, 1, 16, 16, None, None, cos, sin) is None   # not contiguous
    assert norm_rope_qk(qkv[:1].double(), 2, 1, 16, 16, None, None, cos, sin) is None   # not fp32

    class Gemma(RMSNorm):           # other norm math: the general path
        pass
    n = Gemma(torch.ones(16), 1e-6)
    assert norm_rope_qk(qkv[:1], 2, 1, 16, 16, n, n, cos, sin) is None


def gguf_dequantize(w: GgmlWeight) -> torch.Tensor:
    import gguf
    rb = gq.row_bytes(w.type, w.cols)
    out = gguf.quants.dequantize(w.rows[:, :rb].numpy(), gguf.GGMLQuantizationType(w.type))
    return torch.from_numpy(np.asarray(out, dtype=np.float32))


@pytest.mark.parametrize("isa", kernels.variants_here())
@pytest.mark.parametrize("t", [t for t in KERNEL_TYPES if t not in I_QUANTS], ids=gq.type_name)
def test_embedding_decode_rows_are_gguf_dequantize(isa, t):
    gen = torch.Generator().manual_seed(t)
    cols = 512 if gq.block_elems(t) == 256 else 128
    w = GgmlWeight(gq.quantize(torch.randn(40, cols, generator=gen) * 0.1, t), t, cols)
    pool = CpuPool(kernels.load(isa), 2)
    try:
        emb = GgmlEmbedding(w, torch.float32, pool)
        assert emb.pool is not None
        ids = torch.tensor([[3, 39, 0], [3, 7, 7]])
        assert torch.equal(emb(ids), gguf_dequantize(w)[ids])
        with pytest.raises(IndexError, match="token id 40"):
            emb(torch.tensor([40]))
    finally:
        pool.close()


@pytest.mark.parametrize("n", [1, 3])
def test_add_rms_norm_is_the_add_then_the_norm(n):
    gen = torch.Generator().manual_seed(n)
    x, a = torch.randn(n, 96, generator=gen) * 4, torch.randn(n, 96, generator=gen)
    norm = RMSNorm(torch.rand(96, generator=gen) + 0.5, 1e-6)
    h, out = add_rms_norm(x, a, norm)
    torch.testing.assert_close(out.double(), rms64(x.double() + a.double(), norm.weight, 1e-6), rtol=1e-5, atol=1e-5)
    assert torch.equal(h, x + a) and torch.equal(out, norm(x + a))      # the bits of the two ops it replaces
    assert add_rms_norm(x.double(), a.double(), norm) is None            # not fp32: the caller's two ops


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n", [1, 3])
def test_kv_rows_by_one_call_are_index_copy(dtype, n):
    """K/V rows (views into wider rows, as a decode step's rope output and qkv) stored by the C
    call hold the bits torch's `.to(dtype)` + `index_copy_` store, at extremes too."""
    gen = torch.Generator().manual_seed(n)
    rows = torch.randn(n, 12, 16, generator=gen) * torch.logspace(-40, 38, 16)
    rows[0, 4, :5] = torch.tensor([float("inf"), -float("inf"), -0.0, 3.3895e38, 1.0 + 2 ** -8])
    k, v = rows[:, 4:8], rows[:, 8:]
    slots = torch.tensor([5, 17, 63][:n])
    c_path, ref = KVCache(64, 4, 16, dtype, "cpu"), KVCache(64, 4, 16, dtype, "cpu")
    assert write_rows_c(c_path, slots, k, v)
    ref.k.index_copy_(0, slots, k.to(dtype))
    ref.v.index_copy_(0, slots, v.to(dtype))
    assert torch.equal(c_path.k, ref.k) and torch.equal(c_path.v, ref.v)
    with pytest.raises(IndexError, match="outside the cache"):
        c_path.write(torch.tensor([64]), k[:1], v[:1])
    assert not write_rows_c(c_path, slots, k.double(), v.double())      # not fp32: index_copy_ does it
