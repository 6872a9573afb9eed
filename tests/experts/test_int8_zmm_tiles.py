"""The int8 / mxfp4 dot tiles in zmm registers (kernels/c/int8_zmm.c) against the ymm tiles they
replace (the same bits: exact integer sums, the same float operations per lane) and against float64
references of the kernels' activation rounding, 1-4096 tokens, on the experts and the dense GEMV;
every build this CPU runs, each with the switch forced both ways (only AVX-512 builds have it)."""
from __future__ import annotations

import ctypes

import pytest
import torch

from freetoken import kernels
from freetoken.experts.execution.cpu import CpuExpertExecutor
from freetoken.experts.formats import activate, dequantize_expert, quantize_banks
from freetoken.kernels.pool import CpuPool
from freetoken.quant.int8 import dequantize_int8, quantize_int8
from freetoken.quant.mxfp4 import dequantize_mxfp4, quantize_mxfp4

ISAS = kernels.variants_here()
FMT_CODE = {"int8": 5, "mxfp4": 4}
# (hidden, inter): 32-blocks per row 9 / 3 (an 8-block step, no step, unpaired tails) and 11 / 10
# (a step, a pair and an unpaired block)
SHAPES = ((288, 96), (352, 320))


def q8(v: torch.Tensor) -> torch.Tensor:
    """The kernels' activation rounding (int8 per 32, scale amax / 127, half to even), in float64."""
    b = v.float().unflatten(-1, (-1, 32))
    d = b.abs().amax(-1, keepdim=True) / 127.0
    return (torch.round(b * torch.where(d > 0, 1.0 / d, torch.zeros_like(d))) * d).flatten(-2).double()


def experts64(banks, fmt, x, ids, w, inter):
    """float64 sum_k w * down(silu(gate) * up) with x and h rounded as the kernels round them."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for e in ids.unique().tolist():
        if e < 0:
            continue
        gu, dn = dequantize_expert(banks, fmt, e, torch.float64)
        t, k = (ids == e).nonzero(as_tuple=True)
        h = q8(x[t]) @ gu.T
        a = activate(h[:, :inter], h[:, inter:], "silu", 1.702, 7.0)
        out.index_add_(0, t, w[t, k].double().unsqueeze(1) * (q8(a.float()) @ dn.T))
    return out


def both_ways(lib, run):
    """run() with the ymm tiles, then with the zmm ones (where the build has them: else None)."""
    was = lib.ft_set_int8_zmm(-1)
    try:
        lib.ft_set_int8_zmm(0)
        ymm = run()
        zmm = run() if lib.ft_set_int8_zmm(1) else None
        return ymm, zmm
    finally:
        lib.ft_set_int8_zmm(was)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", ["int8", "mxfp4"])
def test_expert_tiles_both_ways_equal_and_match_float64(fmt, isa):
    gen = torch.Generator().manual_seed(torch.seed() % (2**31))
    lib = kernels.load(isa)
    if isa != "native":                         # only AVX-512 builds have the zmm tiles
        assert both_ways(lib, lambda: 0)[1] is None
    n = 4
    for hidden, inter in SHAPES:
        banks = quantize_banks(torch.randn(n, 2 * inter, hidden, generator=gen) * 0.1,
                               torch.randn(n, hidden, inter, generator=gen) * 0.1, fmt)
        ex = CpuExpertExecutor(banks, fmt, hidden, inter, isa=isa, gemm_tokens=0)
        try:
            for t in (1, 2, 3, 5, 17, 130) + ((4096,) if hidden == 288 else ()):
                ids = torch.randint(0, n, (t, 2), generator=gen)
                ids[: t // 2 + 1, 0] = 1            # one expert with many tokens: the prefill tiles
                w = torch.rand(t, 2, generator=gen)
                x = torch.randn(t, hidden, generator=gen)
                ymm, zmm = both_ways(lib, lambda: ex.run(x, ids, w))
                ref = experts64(banks, fmt, x, ids, w, inter)
                err = ((ymm.double() - ref).abs().max() / ref.abs().max()).item()
                assert err < 4e-3, (fmt, hidden, t, err)      # an int8 rounding tie of h (tests/experts/test_cpu_kernels.py)
                if zmm is not None:
                    assert torch.equal(zmm, ymm), (fmt, hidden, t)
        finally:
            ex.close()


def dense_rows(fmt, N, K, gen):
    """(weight rows, scale rows, their float64 values) of an N x K matrix in fmt."""
    m = torch.randn(N, K, generator=gen)
    if fmt == "int8":
        q, s = quantize_int8(m)
        return q.view(torch.uint8), s.view(torch.uint8), dequantize_int8(q, s, torch.float64)
    b, s = quantize_mxfp4(m)
    return b.reshape(N, K // 2).contiguous(), s, dequantize_mxfp4(b, s, torch.float64).reshape(N, K)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", ["int8", "mxfp4"])
def test_dense_gemv_rows_both_ways(fmt, isa):
    """ft_linear_run's tiles over row counts that leave 1-3 rows of a 4-row tile (the zmm tiles'
    last pair half empty) and 1-9 tokens."""
    gen = torch.Generator().manual_seed(torch.seed() % (2**31))
    lib = kernels.load(isa)
    pool = CpuPool(lib, 2)
    try:
        for N, K in ((35, 288), (18, 352), (33, 64)):
            wq, sq, w64 = dense_rows(fmt, N, K, gen)
            for M in (1, 2, 3, 4, 9):
                x = torch.randn(M, K, generator=gen)

                def run():
                    y = torch.empty(M, N)
                    assert lib.ft_linear_run(pool.handle, FMT_CODE[fmt], wq.data_ptr(), wq.stride(0), sq.data_ptr(),
                                             sq.stride(0), N, K, x.data_ptr(), 0, M, None, y.data_ptr()) == 0
                    return y
                ymm, zmm = both_ways(lib, run)
                ref = q8(x) @ w64.T
                assert ((ymm.double() - ref).abs().max() / ref.abs().max()).item() < 1e-5, (fmt, N, K, M)
                if zmm is not None:
                    assert torch.equal(zmm, ymm), (fmt, N, K, M)
    finally:
        pool.close()


def test_the_zmm_switch_is_in_the_switches_array():
    lib = kernels.load("native")
    was = lib.ft_set_int8_zmm(-1)
    try:
        on = lib.ft_set_int8_zmm(1)
        vals = (ctypes.c_int * lib.ft_switches(None, None))()
        lib.ft_switches(vals, None)
        assert vals[len(vals) - 1] == on
    finally:
        lib.ft_set_int8_zmm(was)
