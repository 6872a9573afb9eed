"""The prefill GEMM tiles over bf16 weights (kernels/c/gemm_bf16.c: AMX, vdpbf16ps, plain C)
against float64 references of the same arithmetic (x and h rounded to bf16, products exact), on
every kernel build and every tile mode that runs there, from 1 to 4096 tokens."""
from __future__ import annotations

import pytest
import torch

from freetoken import kernels
from freetoken.experts.execution.cpu import CpuExpertExecutor
from freetoken.kernels.gemm import GEMM_MODES, mode_code, modes_here
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
    was, once = lib.ft_gemm_stream(-1), lib.ft_gemm_copy_once(-1)
    try:
        # AMX's results streamed past the caches (forced from 0 bytes of output) and stored cached;
        # the weight sub-panels copied per chunk of tokens, or once from 2 chunks (kept for the rest)
        for stream_min, min_chunks in (((0, 0), (1 << 62, 2)) if mode == "amx" else ((was, once),)):
            lib.ft_gemm_stream(stream_min)
            lib.ft_gemm_copy_once(min_chunks)
            _dense_shapes(lib, pool, code, mode, gen)
    finally:
        lib.ft_gemm_stream(was)
        lib.ft_gemm_copy_once(once)
        pool.close()


def _dense_shapes(lib, pool, code, mode, gen):
    # tokens 1..4096; rows not a multiple of 16/32 (tails); K odd or not a multiple of 32; several
    # chunks of tokens and K sub-panels (AMX copies the next sub-panel during the tiles); rows of
    # the output 64 bytes apart (n + 2 = 64: whole lines streamed) or not; 2-4 chunks with row and K tails
    for m, n, k in ((1, 5, 32), (17, 33, 64), (40, 50, 96), (300, 77, 2048), (33, 17, 34), (70, 40, 45),
                    (4096, 48, 64), (129, 3000, 64), (700, 40, 300), (600, 70, 2048), (1100, 62, 320),
                    (2100, 45, 37)):
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
            assert lib.ft_set_gemm(code, 1, 0) == code
            for t, k in ((1, 2), (9, 3), (70, 4)):
                ids, w = routes(t, k, 6, gen)
                x = torch.randn(t, hidden, generator=gen)
                y = ex.run(x, ids, w)
                rounded, slack = rounded_reference(banks, dense, x, ids, w, inter)
                assert ((y.double() - rounded).abs() <= 1e-4 * rounded.abs().max() + slack).all(), (hidden, t, k)
                assert rel_err(y, reference64(banks, dense, x, ids, w, "swiglu_oai")) < 2e-2
        finally:
            lib.ft_set_gemm(0, 16, 0)
            ex.close()


@pytest.mark.parametrize("isa,mode", CASES)
def test_silu_experts_over_chunks_match_rounded_reference(isa, mode):
    """SiLU experts (the vector activation, 16 columns at a time, and its column tails) with one
    group of 300 tokens at hidden 2048: more than one chunk of tokens of the tiles (256 there),
    run chunk by chunk; the float64 reference with x and h rounded to bf16."""
    lib, code = _lib_mode(isa, mode)
    gen = torch.Generator().manual_seed(torch.seed() % (2**31))
    hidden, inter = 2048, 40
    banks = make_banks("bf16", 3, hidden, inter, True, gen)
    ex = CpuExpertExecutor(banks, "bf16", hidden, inter, activation="silu", isa=isa, num_threads=2, gemm_tokens=0)
    dense = dense64(banks, "bf16")
    try:
        assert lib.ft_set_gemm(code, 1, 0) == code
        ids, w = routes(300, 2, 3, gen)
        ids[:, 0] = 1                                   # expert 1: a group of 300+ tokens
        x = torch.randn(300, hidden, generator=gen)
        y = ex.run(x, ids, w)
        rounded, slack = rounded_reference(banks, dense, x, ids, w, inter, act="silu")
        assert ((y.double() - rounded).abs() <= 1e-4 * rounded.abs().max() + slack).all()
    finally:
        lib.ft_set_gemm(0, 16, 0)
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
            assert lib.ft_set_gemm(code, 16, code) == 0 and lib.ft_get_gemm(1) == 0


@pytest.mark.parametrize("mode", ["amx", "vdpbf16ps"])
def test_linear_prefill_through_tiles(mode):
    """A bf16 Linear built for bf16 prefill GEMMs, under the dense switch: x rounded to bf16, fp32
    out; decode sizes keep the exact GEMV. A Linear built for fp32 GEMMs stays exact."""
    from freetoken.layers.kernel_rows import GEMV_TOKENS
    from freetoken.layers.linear import Linear
    from freetoken.kernels.pool import shared_pool
    pool = shared_pool()
    lib = pool.lib
    if mode not in modes_here(lib) and mode == "amx":
        pytest.skip("AMX tiles do not run here")
    g = torch.Generator().manual_seed(torch.seed() % (2**31))
    w, b = torch.randn(50, 96, generator=g), torch.randn(50, generator=g)
    lin = Linear(w, b, compute_dtype=torch.float32, storage_dtype=torch.bfloat16, pool=pool, gemm_dtype=torch.bfloat16)
    prev = lib.ft_get_gemm(0), lib.ft_get_gemm(1)
    try:
        lib.ft_set_gemm(0, 16, mode_code(lib, mode))
        for m in (1, GEMV_TOKENS + 1, 300):
            x = torch.randn(m, 96, generator=g)
            y = lin(x)
            xr = x.bfloat16().double() if m > GEMV_TOKENS else x.double()
            ref = xr @ w.bfloat16().double().T + b.double()
            assert (y.double() - ref).abs().max().item() <= 1e-5 * ref.abs().max().item(), m
        exact = Linear(w, b, compute_dtype=torch.float32, storage_dtype=torch.bfloat16, pool=pool)
        x = torch.randn(300, 96, generator=g)
        ref = x.double() @ w.bfloat16().double().T + b.double()
        assert (exact(x).double() - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()
    finally:
        lib.ft_set_gemm(prev[0], 16, prev[1])


@pytest.mark.parametrize("mode", ["amx", "vdpbf16ps"])
def test_engine_prefill_under_forced_tiles(tiny_dir, mode):
    """A bf16 MoE model's prompt logits with prefill_gemm forced to the tiles (dense layers and
    experts) agree with the exact fp32 path to bf16 rounding of the GEMM inputs; the switch is
    what the choice says."""
    from freetoken import LLM
    lib = kernels.load()
    if mode == "amx" and "amx" not in modes_here(lib):
        pytest.skip("AMX tiles do not run here")
    model = tiny_dir("qwen3_moe", dtype="bfloat16", layers=2, experts=4, top_k=2)
    prompt = torch.randint(0, 400, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    exact = LLM(str(model), dtype="bfloat16", prefill_gemm="float32", bf16_dot="off")
    ref = exact.score(prompt)
    exact.close()
    tiles = LLM(str(model), dtype="bfloat16", prefill_gemm=mode, bf16_dot="off")
    try:
        with tiles.engine.model.kernel_switches.installed():     # the engine's own switches
            assert lib.ft_get_gemm(0) == lib.ft_get_gemm(1) == mode_code(lib, mode)
        got = tiles.score(prompt)
    finally:
        tiles.close()
    err = ((got.double() - ref.double()).abs().max() / ref.double().abs().max()).item()
    assert 0 < err < 3e-2, err
