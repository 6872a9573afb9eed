"""Dense layers in llama.cpp's lattice i-quants (IQ1_S .. IQ3_S) kept packed, on the C kernels,
against the gguf package's reference `dequantize` and float64 matmuls, every kernel variant."""
from __future__ import annotations

import pytest
import torch
from test_ggml_linear import gguf_dequantize, q8_act, rel_err

from freetoken import kernels
from freetoken.kernels.pool import CpuPool
from freetoken.layers.ggml_linear import KERNEL_TYPES, GgmlLinear, GgmlWeight
from freetoken.layers.kernel_rows import GEMV_TOKENS
from freetoken.quant import ggml_iquants as iq
from freetoken.quant import ggml_quants as gq

ISAS = kernels.variants_here()


def rows(t: int, n: int, cols: int, gen: torch.Generator) -> GgmlWeight:
    """Random valid blocks, d = 0.004 in most rows and random (any finite bits, values kept
    O(1) by the mask) in every third; 7 bytes past the blocks that the kernels must ignore."""
    w = iq.random_rows(t, n, cols, gen, scale=0.004)
    w[::3] = iq.random_rows(t, n, cols, gen)[::3]
    pad = torch.randint(0, 256, (n, 7), dtype=torch.uint8, generator=gen)
    return GgmlWeight(torch.cat([w, pad], 1), t, cols)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("t", iq.TYPES, ids=gq.type_name)
def test_each_type_matches_float64_reference(isa, t):
    assert t in KERNEL_TYPES
    gen = torch.Generator().manual_seed(t)
    K = 512
    parts = [rows(t, 5, K, gen), rows(t, 37, K, gen)]          # odd row counts, two segments
    bias = torch.randn(42, generator=gen)
    pool = CpuPool(kernels.load(isa), 2, small_job_bytes=0)
    lin = GgmlLinear(parts, bias, pool)
    ref_w = torch.cat([gguf_dequantize(p) for p in parts])
    assert torch.equal(lin.dequantized(), ref_w)                # C row dequantization: bit-exact
    for M in list(range(1, 12)) + [GEMV_TOKENS, GEMV_TOKENS + 1, 130]:
        x = torch.randn(M, K, generator=gen)
        y = lin(x)
        exact = x.double() @ ref_w.double().T + bias.double()
        if M <= GEMV_TOKENS:    # int8 activations per 32; exact up to fp32 sums against that
            assert rel_err(y, q8_act(x) @ ref_w.double().T + bias.double()) < 1e-4, M
            assert rel_err(y, exact) < 5e-2, M
        else:                   # prefill: dequantized rows and a float GEMM
            assert rel_err(y, exact) < 1e-5, M
    pool.close()


@pytest.mark.parametrize("isa", ISAS)
def test_mixed_i_and_k_quants_in_one_layer(isa):
    """A fused layer of a dynamic mix: IQ3_XXS, IQ2_XXS, Q6_K, IQ1_M and IQ3_S parts; bf16 inputs."""
    gen = torch.Generator().manual_seed(3)
    K = 256
    q6 = GgmlWeight(gq.quantize(torch.randn(8, K, generator=gen) * 0.1, gq.Q6_K), gq.Q6_K, K)
    parts = [rows(iq.IQ3_XXS, 33, K, gen), rows(iq.IQ2_XXS, 8, K, gen), q6, rows(iq.IQ1_M, 3, K, gen),
             rows(iq.IQ3_S, 19, K, gen)]
    pool = CpuPool(kernels.load(isa), 2, small_job_bytes=0)
    lin = GgmlLinear(parts, None, pool)
    ref_w = torch.cat([gguf_dequantize(p) for p in parts]).double()
    for M in (1, 4, 7):
        x = torch.randn(M, K, generator=gen).to(torch.bfloat16)
        y = lin(x)
        assert y.dtype == torch.bfloat16 and y.shape == (M, 71)
        assert rel_err(y, q8_act(x.float()) @ ref_w.T) < 1e-2
    pool.close()
