"""The prefill tiles over experts in llama.cpp block types (kernels/c/ggml_tiles.c: each weight row
decoded once into a bf16 panel, then gemm_bf16.c's AMX / vdpbf16ps / plain tiles) against float64
references: the panel's decode against gguf.quants.dequantize, and routed experts in calls of
1..300 tokens crossing the call and per-expert thresholds, for every block type, kernel build and
tile mode this CPU runs."""
from __future__ import annotations

import functools

import gguf
import numpy as np
import pytest
import torch
from test_cpu_kernels import dense64, q8_act, rel_err, routes
from test_ggml_iq_kernels import iq_banks

from freetoken import kernels
from freetoken.experts.execution.cpu import CpuExpertExecutor
from freetoken.experts.ggml_banks import KERNEL_TYPES, quantize_ggml
from freetoken.kernels.gemm import GEMM_MODES, modes_here
from freetoken.quant import ggml_quants as gq
from freetoken.quant.ggml_act import ACT_MODES
from freetoken.quant.ggml_iquants import TYPES as I_QUANTS

H, I, N = 512, 256, 6
CALL_MIN, GROUP_MIN = 40, 12        # forced thresholds: calls of >= 40 tokens, experts with >= 12 of them
CASES = [(isa, mode) for isa in kernels.variants_here() for mode in GEMM_MODES
         if mode in modes_here(kernels.load(isa))]


def bf16(v: torch.Tensor) -> torch.Tensor:
    return v.float().bfloat16().double()


@pytest.mark.parametrize("isa", kernels.variants_here())
def test_panel_decode_is_gguf_dequantize_rounded_to_bf16(isa):
    """Every type, random valid blocks (every bit pattern): the panel row is gguf.quants.dequantize's
    float32 value rounded to bf16 (within one bf16 step: the decode's fused multiply-subtract
    rounds once where the reference may round twice); legacy rows with a tail of < 8 blocks."""
    lib = kernels.load(isa)
    gen = torch.Generator().manual_seed(3)
    for t in KERNEL_TYPES:
        cols = 544 if gq.block_elems(t) == 32 else 512
        rows = gq.random_rows(t, 8, cols, gen)
        if t == gq.MXFP4:   # e8m0 scales below 2^120: no value past float32's range
            rows.view(8, -1, 17)[..., 0] = torch.randint(0, 248, (8, cols // 32), dtype=torch.uint8, generator=gen)
        out = torch.empty(8, cols, dtype=torch.bfloat16)
        lib.ft_ggml_rows_bf16(t, rows.data_ptr(), rows.stride(0), 8, cols, out.data_ptr())
        ref = torch.from_numpy(gguf.quants.dequantize(rows.numpy(), gguf.GGMLQuantizationType(t))
                               .astype(np.float32)).reshape(8, cols).double()
        got = out.double()
        assert torch.isfinite(got).all(), gq.type_name(t)
        assert ((got - ref).abs() <= ref.abs() * 2.0 ** -8 + 1.2e-38).all(), gq.type_name(t)


@functools.cache
def type_banks(t: int):
    gen = torch.Generator().manual_seed(t)
    if t in I_QUANTS:
        banks = iq_banks(N, (t, t, t), gen)
    else:
        banks = quantize_ggml(torch.randn(N, 2 * I, H, generator=gen) * 0.1,
                              torch.randn(N, H, I, generator=gen) * 0.1, t)
    return banks, dense64(banks, "ggml")


def reference(dense, x, ids, w, call_tiles: bool):
    """float64: an expert with >= GROUP_MIN tokens of a tiles call multiplies bf16 weights by x and h
    rounded to bf16; the others the exact weights by x and h quantized per 32 to int8 (after the
    tiles call's bf16 rounding)."""
    gu_all, dn_all = dense
    out = torch.zeros(x.shape, dtype=torch.float64)
    for e in range(N):
        rows, cols = (ids == e).nonzero(as_tuple=True)
        if not len(rows):
            continue
        tiles = call_tiles and len(rows) >= GROUP_MIN
        xr = bf16(x[rows]) if call_tiles else x[rows].double()
        gu, dn = (bf16(gu_all[e]), bf16(dn_all[e])) if tiles else (gu_all[e], dn_all[e])
        h = (xr if tiles else q8_act(xr)) @ gu.T
        a = h[:, :I] / (1 + torch.exp(-h[:, :I])) * h[:, I:]
        a = bf16(a) if call_tiles else a
        y = (a if tiles else q8_act(a)) @ dn.T
        out.index_add_(0, rows, w[rows, cols].double()[:, None] * y)
    return out


@pytest.mark.parametrize("isa,mode", CASES)
@pytest.mark.parametrize("t", KERNEL_TYPES, ids=gq.type_name)
def test_experts_through_ggml_tiles_match_float64_reference(t, isa, mode):
    lib = kernels.load(isa)
    banks, dense = type_banks(t)
    gen = torch.Generator().manual_seed(1000 + t)     # fixed: int8 near-ties make some draws exceed the bound
    ex = CpuExpertExecutor(banks, "ggml", H, I, isa=isa, gemm_tokens=0)
    try:
        lib.ft_set_gemm(0, CALL_MIN, 0)
        assert lib.ft_set_ggml_tiles(GEMM_MODES[mode], GROUP_MIN) == GEMM_MODES[mode]
        for tokens in (1, 7, 39, 40, 64, 150, 300):
            ids, w = routes(tokens, 4, N, gen)
            x = torch.randn(tokens, H, generator=gen)
            y = ex.run(x, ids, w)
            assert torch.isfinite(y).all()
            ref = reference(dense, x, ids, w, tokens >= CALL_MIN)
            assert rel_err(y, ref) < 2e-3, (tokens, gq.type_name(t))
    finally:
        lib.ft_set_ggml_tiles(0, 16)
        lib.ft_set_gemm(0, 16, 0)
        ex.close()


@pytest.mark.parametrize("numerics", ["llama", "q8"])
def test_llama_numerics_keep_the_dots_and_small_calls_their_bits(numerics):
    """Under llama.cpp's numerics the tiles stay off whatever the switch; a call below the call
    threshold (decode steps, verify steps) gives the dots' bits with the tiles switched on."""
    lib = kernels.load("native")
    banks, _ = type_banks(gq.Q4_K)
    gen = torch.Generator().manual_seed(8)
    ex = CpuExpertExecutor(banks, "ggml", H, I, gemm_tokens=0)
    mode = GEMM_MODES[modes_here(lib)[0]]
    try:
        lib.ft_set_ggml_act(ACT_MODES[numerics])
        lib.ft_set_gemm(0, CALL_MIN, 0)
        tokens = 64 if numerics == "llama" else CALL_MIN - 1
        ids, w = routes(tokens, 4, N, gen)
        x = torch.randn(tokens, H, generator=gen)
        lib.ft_set_ggml_tiles(0, 1)
        dots = ex.run(x, ids, w)
        lib.ft_set_ggml_tiles(mode, 1)
        assert torch.equal(ex.run(x, ids, w), dots)
    finally:
        lib.ft_set_ggml_act(ACT_MODES["q8"])
        lib.ft_set_ggml_tiles(0, 16)
        lib.ft_set_gemm(0, 16, 0)
        ex.close()
