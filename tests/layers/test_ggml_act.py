"""llama.cpp's activation rounding for the ggml layers (`ggml_numerics="llama"`,
kernels/c/ggml_act.c + quant/ggml_act.py), forced on every kernel build this CPU runs, against
a float64 reference written from ggml-cpu's quantize_row_q8_0 / q8_1 and vec_dot definitions:
activations int8 per 32 with the scale in fp16, Q4_1 / Q5_1 mins times q8_1's fp16 block sum
(of the unrounded scale), weights from the gguf package's dequantization."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken import kernels
from freetoken.kernels.pool import CpuPool
from freetoken.layers.ggml_linear import GgmlLinear
from freetoken.layers.kernel_rows import GEMV_TOKENS
from freetoken.quant import ggml_quants as gq
from freetoken.quant.ggml_act import ACT_MODES

from test_ggml_linear import gguf_dequantize, q8_act, rel_err, rows

ISAS = kernels.variants_here()
TYPES = [gq.Q8_0, gq.Q4_0, gq.Q4_1, gq.Q5_0, gq.Q5_1, gq.Q4_K, gq.Q6_K]


def llama_reference(x: torch.Tensor, w) -> torch.Tensor:
    """x @ W^T as llama.cpp's vec_dot computes it (exactly, in float64)."""
    b = x.double().numpy().reshape(x.shape[0], -1, 32).astype(np.float32)
    amax = np.abs(b).max(-1, keepdims=True)
    d = amax / np.float32(127)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)   # x86: 127 / amax
    q = np.round(b * inv)                                       # half to even, as _mm256_round_ps
    d16 = d.astype(np.float16).astype(np.float64)
    ref_w = gguf_dequantize(w).double()
    y = torch.from_numpy((q * d16).reshape(x.shape)) @ ref_w.T
    if w.type in (gq.Q4_1, gq.Q5_1):     # x = d_w q_w + m: llama adds m * fp16(d * sum q), not m * fp16(d) sum q
        bs = gq.block_bytes(w.type)
        raw = w.rows[:, :gq.row_bytes(w.type, w.cols)].numpy().reshape(w.rows.shape[0], -1, bs)
        m = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
        sq = q.sum(-1)
        s = (d[..., 0].astype(np.float64) * sq).astype(np.float32).astype(np.float16).astype(np.float64)
        y += torch.from_numpy((s - d16[..., 0] * sq) @ m.T)
    return y


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("t", TYPES, ids=gq.type_name)
def test_llama_rounding_matches_reference(isa, t):
    gen = torch.Generator().manual_seed(100 + t)
    K = 512
    w = rows(t, 23, K, gen)
    lib = kernels.load(isa)
    pool = CpuPool(lib, 2, small_job_bytes=0)
    lin = GgmlLinear([w], None, pool)
    try:
        assert lib.ft_set_ggml_act(ACT_MODES["llama"]) == 1
        for M in (1, 2, 5, GEMV_TOKENS, GEMV_TOKENS + 1, 130):     # the GEMV and the prefill GEMM
            x = torch.randn(M, K, generator=gen) * torch.rand(M, 1, generator=gen) * 30
            x[0, :32] = 0                                            # an all-zero block: scale 0
            assert rel_err(lin(x), llama_reference(x, w)) < 1e-5, (isa, M)
    finally:
        lib.ft_set_ggml_act(0)
        pool.close()


@pytest.mark.parametrize("t", [gq.Q4_1, gq.Q8_0], ids=gq.type_name)
def test_q8_and_float32_numerics(t):
    """q8 (the default) keeps prefill activations exact and rounds the GEMV's per 32 with fp32
    scales; float32 is exact on both paths (x @ the gguf-dequantized rows)."""
    gen = torch.Generator().manual_seed(7)
    w = rows(t, 11, 256, gen)
    lib = kernels.load(ISAS[0])
    pool = CpuPool(lib, 2, small_job_bytes=0)
    lin = GgmlLinear([w], None, pool)
    ref_w = gguf_dequantize(w).double()
    try:
        assert lib.ft_set_ggml_act(ACT_MODES["q8"]) == 0 and lib.ft_set_ggml_act(-1) == 0
        big, small = torch.randn(GEMV_TOKENS + 3, 256, generator=gen), torch.randn(3, 256, generator=gen)
        assert rel_err(lin(big), big.double() @ ref_w.T) < 1e-5
        assert rel_err(lin(small), q8_act(small) @ ref_w.T) < 1e-5
        assert rel_err(lin(small), small.double() @ ref_w.T) > 1e-4      # the GEMV did round
        assert lib.ft_set_ggml_act(ACT_MODES["float32"]) == 2
        assert rel_err(lin(small), small.double() @ ref_w.T) < 1e-5
        assert rel_err(lin(big), big.double() @ ref_w.T) < 1e-5
    finally:
        lib.ft_set_ggml_act(0)
        pool.close()
