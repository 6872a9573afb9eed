"""The prefill GEMM tiles over bf16 weights (kernels/c/gemm_bf16.c: AMX, vdpbf16ps, plain C)
against float64 references of the same arithmetic (x and h rounded to bf16, products exact), on
every kernel build and every tile mode that runs there, from 1 to 4096 tokens."""
from __future__ import annotations

import pytest
import torch

from freetoken import kernels
from freetoken.experts.cpu import CpuExpertExecutor
from freetoken.kernels.gemm import GEMM_MODES, modes_here
from freetoken.kernels.pool import CpuPool

from test_cpu_kernels import dense64, make_banks, reference64, rounded_reference, routes, rel_err

CASES = [(isa, mode) for isa in kernels.variants_here() for mode in GEMM_MODES]


def _lib_mode(isa: str, mode: str):
    lib = kernels.load(isa)
    if mode not in modes_here(lib):
        pytest.skip(f"{mode} tiles do not run in the {isa} build here (here: {', '.join(modes_here(lib))})")
    return lib, GEMM_MODES[mode]


@pytest.mark.parametrize("isa,mode", CASES)
def test_dense_gemm_matches_float64_reference(isa, mode):
    lib, code = _lib_mode(isa, mode)
    gen = torch.Generator().manual_seed(torch.seed() % (2**31))
    pool = CpuPool(lib, 2)
    try:
        # tokens 1..4096; rows not a multiple of 16/32 (tails); K odd or not a multiple of 32
        for m, n, k in ((1, 5, 32), (17, 33, 64), (40, 50, 96), (300, 77, 2048), (33, 17, 34), (70, 40, 45),
                        (4096, 48, 64), (129, 3000, 64)):
            if k % 2 and mode != "amx":
                continue        # the vector tiles read whole pairs of a row in place
            x = torch.randn(m, k + 3, generator=gen)[:, :k]          # a row stride wider than K
            w = (torch.randn(n, k + 1, generator=gen) * 0.1).bfloat16()[:, :k]   # weight rows w_rs apart
            b = torch.randn(n, generator=gen)
            y = torch.full((m, n + 2), float("nan"))
            rc = lib.ft_gemm_bf16(pool.handle, code, w.data_ptr(), w.stride(0) * 2, n, k, x.data_ptr(), x.stride(0),
                                  m, b.data_ptr(), y.data_ptr(), y.stride(0))
            assert rc == 0, (m, n, k)
            ref = x.bfloat16().double() @ w.double().T + b.double()
            # fp32 sums of exact products: a few ulp of fp32 times sqrt(K)
            tol = 1e-6 * (x.bfloat16().double().abs() @ w.double().abs().T).max().item()
            assert (y[:, :n].double() - ref).abs().max().item() <= tol, (m, n, k)
            assert y[:, n:].isnan().all()                           # nothing past N written
    finally:
        pool.close()


@pytest.mark.parametrize("isa,mode", CASES)
def test_experts_through_tiles_match_rounded_reference(isa, mode):
    """Routed bf16 experts whose groups all take the tiles (threshold 1 token; groups of 1..70):
    the float64 reference with x and h rounded to bf16, on shapes with SIMD and block tails."""
    lib, code = _lib_mode(isa, mode)
    gen = torch.Generator().manual_seed(torch.seed() % (2**31))
    for hidden, inter in ((200, 72), (256, 96), (66, 34)):
        banks = make_banks("bf16", 6, hidden, inter, True, gen)
        ex = CpuExpertExecutor(banks, "bf16", hidden, inter, activation="swiglu_oai", isa=isa, gemm_tokens=0)
        dense = dense64(banks, "bf16")
        try:
            assert lib.ft_set_gemm(code, 1) == code
            for t, k in ((1, 2), (9, 3), (70, 4)):
                ids, w = routes(t, k, 6, gen)
                x = torch.randn(t, hidden, generator=gen)
                y = ex.run(x, ids, w)
                rounded, slack = rounded_reference(banks, dense, x, ids, w, inter)
                assert ((y.double() - rounded).abs() <= 1e-4 * rounded.abs().max() + slack).all(), (hidden, t, k)
                assert rel_err(y, reference64(banks, dense, x, ids, w, "swiglu_oai")) < 2e-2
        finally:
            lib.ft_set_gemm(0, 16)
            ex.close()


def test_refused_modes_say_so():
    """A mode the build lacks answers -3 (the caller falls back), and the switch reports 0."""
    for isa in kernels.variants_here():
        lib = kernels.load(isa)
        here = modes_here(lib)
        for mode, code in GEMM_MODES.items():
            if mode in here:
                continue
            x, w, y = torch.zeros(4, 32), torch.zeros(8, 32, dtype=torch.bfloat16), torch.zeros(4, 8)
            pool = CpuPool(lib, 1)
            try:
                assert lib.ft_gemm_bf16(pool.handle, code, w.data_ptr(), 64, 8, 32, x.data_ptr(), 32, 4, None,
                                        y.data_ptr(), 8) == -3
            finally:
                pool.close()
            assert lib.ft_set_gemm(code, 16) == 0
