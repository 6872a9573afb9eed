"""Dense layers over llama.cpp block types (GGUF quantized weights kept packed) on the C kernels,
against the gguf package's reference `dequantize` and float64 torch matmuls, in every kernel
variant this CPU runs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken import kernels
from freetoken.kernels.pool import CpuPool
from freetoken.layers.ggml_linear import KERNEL_TYPES, GgmlEmbedding, GgmlLinear, GgmlWeight
from freetoken.layers.kernel_rows import GEMV_TOKENS
from freetoken.quant import ggml_quants as gq

ISAS = kernels.variants_here()


def gguf_dequantize(w: GgmlWeight) -> torch.Tensor:
    """The independent reference: the gguf package's numpy dequantization."""
    import gguf
    rb = gq.row_bytes(w.type, w.cols)
    out = gguf.quants.dequantize(w.rows[:, :rb].numpy(), gguf.GGMLQuantizationType(w.type))
    return torch.from_numpy(np.asarray(out, dtype=np.float32))


def q8_act(v: torch.Tensor) -> torch.Tensor:
    """The kernels' activation rounding (per 32: int8, scale amax/127, round half to even)."""
    b = v.float().unflatten(-1, (-1, 32))
    d = b.abs().amax(-1, keepdim=True) / 127.0
    return (torch.round(b * torch.where(d > 0, 1.0 / d, torch.zeros_like(d))) * d).flatten(-2).double()


def rows(t: int, n: int, cols: int, gen: torch.Generator) -> GgmlWeight:
    """Valid rows of type t: quantized Gaussians, with random bytes mixed in (every bit pattern of
    nibbles, high bits and 6-bit scales), scales tamed so values stay O(1)."""
    w = gq.quantize(torch.randn(n, cols, generator=gen) * 0.1, t)
    rnd = gq.random_rows(t, n, cols, gen)
    if t == gq.MXFP4:
        rnd.view(n, -1, 17)[..., 0] = torch.randint(118, 128, (n, cols // 32), dtype=torch.uint8, generator=gen)
    else:
        off = gq.f16_scale_offsets(t)
        blk = rnd.view(n, -1, gq.block_bytes(t))
        for o in off:                     # fp16 scales in [2^-9, 2^-7)
            blk[..., o + 1] = (blk[..., o + 1] & 0x83) | 0x18
    w[::2] = rnd[::2]
    pad = torch.randint(0, 256, (n, 7), dtype=torch.uint8, generator=gen)   # bytes past the blocks: ignored
    return GgmlWeight(torch.cat([w, pad], 1), t, cols)


def cols_for(t: int) -> int:
    return 512 if gq.block_elems(t) == 256 else 96 + 32   # legacy: a row that is not whole 256s


def rel_err(y, ref) -> float:
    return float((y.double() - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("t", KERNEL_TYPES, ids=gq.type_name)
def test_each_type_matches_float64_reference(isa, t):
    gen = torch.Generator().manual_seed(t)
    K = cols_for(t)
    parts = [rows(t, 5, K, gen), rows(t, 37, K, gen)]        # odd row counts, two segments
    bias = torch.randn(42, generator=gen)
    pool = CpuPool(kernels.load(isa), 2, small_job_bytes=0)
    lin = GgmlLinear(parts, bias, pool)
    ref_w = torch.cat([gguf_dequantize(p) for p in parts])
    assert torch.equal(lin.dequantized(), ref_w)              # bit-exact row dequantization
    for M in (*range(1, 12), GEMV_TOKENS, GEMV_TOKENS + 1, 130):
        x = torch.randn(M, K, generator=gen)
        y = lin(x)
        exact = x.double() @ ref_w.double().T + bias.double()
        if M <= GEMV_TOKENS:    # int8 activations per 32 (llama.cpp's); exact up to fp32 sums against that
            assert rel_err(y, q8_act(x) @ ref_w.double().T + bias.double()) < 1e-4, M
            assert rel_err(y, exact) < 4e-2, M
        else:                   # prefill: dequantized rows and a float GEMM
            assert rel_err(y, exact) < 1e-5, M
    pool.close()


@pytest.mark.parametrize("isa", ISAS)
def test_mixed_types_in_one_layer(isa):
    """q|k|v of a Q4_K_M file: Q4_K, Q4_K and Q6_K parts (and Q8_0 / Q5_K), bf16 inputs, and
    prefill tiles that cut through the parts."""
    gen = torch.Generator().manual_seed(3)
    K = 256
    parts = [rows(gq.Q4_K, 33, K, gen), rows(gq.Q4_K, 8, K, gen), rows(gq.Q6_K, 8, K, gen),
             rows(gq.Q8_0, 3, K, gen), rows(gq.Q5_K, 19, K, gen)]
    pool = CpuPool(kernels.load(isa), 2, small_job_bytes=0)
    lin = GgmlLinear(parts, None, pool)
    ref_w = torch.cat([gguf_dequantize(p) for p in parts]).double()
    for M in (1, 4, 7):
        x = torch.randn(M, K, generator=gen).to(torch.bfloat16)
        y = lin(x)
        assert y.dtype == torch.bfloat16 and y.shape == (M, 71)
        assert rel_err(y, q8_act(x.float()) @ ref_w.T) < 1e-2      # output rounded to bf16
    x = torch.randn(2, 3, K, generator=gen)                         # batched leading dims pass through
    assert lin(x).shape == (2, 3, 71)
    import freetoken.layers.ggml_linear as gl
    old, gl._TILE_FLOATS = gl._TILE_FLOATS, 64 * K                  # tiles of 64 rows: cut through parts
    try:
        x = torch.randn(100, K, generator=gen)
        assert rel_err(lin(x), x.double() @ ref_w.T) < 1e-5
    finally:
        gl._TILE_FLOATS = old
    pool.close()


def test_embedding_dequantizes_the_looked_up_rows():
    gen = torch.Generator().manual_seed(1)
    w = rows(gq.Q6_K, 50, 256, gen)
    emb = GgmlEmbedding(w, torch.float32)
    ids = torch.tensor([[3, 49, 0], [3, 7, 7]])
    assert torch.equal(emb(ids), gguf_dequantize(w)[ids])


def test_bad_parts_are_refused():
    gen = torch.Generator().manual_seed(2)
    pool = CpuPool(kernels.load("native"), 1)
    with pytest.raises(ValueError, match="same inputs"):
        GgmlLinear([rows(gq.Q8_0, 2, 64, gen), rows(gq.Q8_0, 2, 96, gen)], None, pool)
    with pytest.raises(ValueError, match="no CPU kernel"):
        GgmlLinear([GgmlWeight(gq.quantize(torch.randn(2, 256), gq.IQ4_XS), gq.IQ4_XS, 256)], None, pool)
    with pytest.raises(ValueError, match="need uint8"):
        GgmlWeight(torch.zeros(2, 10, dtype=torch.uint8), gq.Q8_0, 64)
    pool.close()
