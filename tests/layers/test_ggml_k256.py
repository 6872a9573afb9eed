"""The k-quant rows on per-256 activations (kernels/c/ggml_act.c's ggml_prep256 + ggml.c's krow,
llama.cpp's Q8_K arithmetic), forced on and off on every kernel build this CPU runs, against
float64 references on the gguf package's dequantization: with the activations rounded as the
switch says (per 256 for Q2_K .. Q6_K rows when on, per 32 otherwise) the kernels are exact up
to fp32 sums; against the unrounded product the error stays within the bound the per-256
rounding allows (|x - q d| <= d / 2 per element, d = amax / 127 of its 256)."""
from __future__ import annotations

import pytest
import torch
from helpers import q8k_act
from test_ggml_linear import gguf_dequantize, q8_act, rel_err, rows

from freetoken import kernels
from freetoken.kernels.pool import CpuPool
from freetoken.layers.ggml_linear import GgmlLinear
from freetoken.quant import ggml_quants as gq

ISAS = kernels.variants_here()
K_QUANTS = [gq.Q2_K, gq.Q3_K, gq.Q4_K, gq.Q5_K, gq.Q6_K]


def rounding_bound(x: torch.Tensor, w64: torch.Tensor) -> torch.Tensor:
    """[M, N] bound of |x q8k - x| @ |W|^T: half a step d = amax / 127 per element of each 256."""
    step = x.double().abs().unflatten(-1, (-1, 256)).amax(-1, keepdim=True) / 254
    return step.expand(*step.shape[:-1], 256).flatten(-2) @ w64.abs().T


def switched(lib, on: int):
    assert lib.ft_set_ggml_k256(on) == on and lib.ft_set_ggml_k256(-1) == on


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("t", K_QUANTS, ids=gq.type_name)
def test_rows_on_per_256_activations(isa, t):
    gen = torch.Generator().manual_seed(300 + t)
    K = 512
    w = rows(t, 37, K, gen)
    w64 = gguf_dequantize(w).double()
    lib = kernels.load(isa)
    pool = CpuPool(lib, 2, small_job_bytes=0)
    lin = GgmlLinear([w], None, pool)
    try:
        for M in (1, 2, 3, 4, 6):                       # 1-4 tokens per tile, and a tile of 4 + 2
            x = torch.randn(M, K, generator=gen) * torch.rand(M, 1, generator=gen) * 10
            x[0, 256:] = 0                              # an all-zero super-block: scale 0
            switched(lib, 1)
            y = lin(x)
            assert rel_err(y, q8k_act(x) @ w64.T) < 1e-5, (isa, M)
            exact = x.double() @ w64.T
            assert ((y.double() - exact).abs() <= rounding_bound(x, w64) * 1.001 + 1e-5 * exact.abs().max()).all()
            switched(lib, 0)
            y = lin(x)
            assert rel_err(y, q8_act(x) @ w64.T) < 1e-5, (isa, M)
            assert rel_err(y, q8k_act(x) @ w64.T) > 1e-5        # the switch did change the rounding
    finally:
        lib.ft_set_ggml_k256(0)
        pool.close()


@pytest.mark.skipif("avx2" not in ISAS, reason="no AVX-512 here: one x86 path only")
@pytest.mark.parametrize("t", K_QUANTS, ids=gq.type_name)
def test_avx512_sums_equal_the_avx2_ones(t):
    """The AVX-512 loop folds its two halves in integer: the same lanes, bit for bit. One token's
    rows go four at a time (Q4_K; Q6_K with its pairs decoded in 512-bit registers), AVX2's Q6_K
    two at a time: 17-19 rows end in runs of 1-3, 2048-wide rows take eight super-blocks."""
    gen = torch.Generator().manual_seed(7 + t)
    for n_rows, K, M in ((19, 768, 5), (19, 768, 1), (18, 768, 1), (17, 2048, 1), (18, 2048, 3)):
        w, x = rows(t, n_rows, K, gen), torch.randn(M, K, generator=gen)
        ys = []
        for isa in ("native", "avx2"):
            lib = kernels.load(isa)
            pool = CpuPool(lib, 1, small_job_bytes=0)
            try:
                switched(lib, 1)
                ys.append(GgmlLinear([w], None, pool)(x))
            finally:
                lib.ft_set_ggml_k256(0)
                pool.close()
        assert torch.equal(ys[0], ys[1]), (n_rows, K, M)
