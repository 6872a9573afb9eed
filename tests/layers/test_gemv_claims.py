"""The dense GEMV's rows claimed in pieces by whichever pool thread is free (dense.c `gemv_fn`,
pool.c `pool_run_claims`): a layer of several widths (fused q|k|v of a Q4_K_M file, more rows
than one piece, a ragged last piece) and a bf16 layer, against float64 references and bit for bit
across 1, 2 and more threads than cores, whose workers never spin (each call wakes them, so they
often join late) or are preempted mid-call."""
from __future__ import annotations

import os

import pytest
import torch
from test_ggml_linear import gguf_dequantize, q8_act, rel_err, rows

from freetoken import kernels
from freetoken.kernels.pool import CpuPool
from freetoken.layers.ggml_linear import GgmlLinear
from freetoken.layers.linear import Linear
from freetoken.quant import ggml_quants as gq

ISAS = kernels.variants_here()
POOLS = (1, 2, len(os.sched_getaffinity(0)) + 1)


@pytest.mark.parametrize("isa", ISAS)
def test_ggml_rows_in_pieces(isa):
    gen = torch.Generator().manual_seed(39)
    K = 256
    parts = [rows(gq.Q4_K, 130, K, gen), rows(gq.Q6_K, 70, K, gen), rows(gq.Q8_0, 45, K, gen)]
    ref_w = torch.cat([gguf_dequantize(p) for p in parts]).double()
    pools = [CpuPool(kernels.load(isa), n, spin_us=0, small_job_bytes=0) for n in POOLS]
    lins = [GgmlLinear(parts, None, p) for p in pools]
    try:
        for M in (1, 3, 8):
            x = torch.randn(M, K, generator=gen)
            one = lins[0](x)
            assert rel_err(one, q8_act(x) @ ref_w.T) < 1e-4, M
            for lin in lins[1:]:
                for _ in range(20):
                    assert torch.equal(lin(x), one), (isa, M, lin.pool.num_threads)
    finally:
        for p in pools:
            p.close()


@pytest.mark.parametrize("isa", ISAS)
def test_bf16_rows_in_pieces(isa):
    gen = torch.Generator().manual_seed(40)
    N, K = 200, 96
    w, b = torch.randn(N, K, generator=gen), torch.randn(N, generator=gen)
    pools = [CpuPool(kernels.load(isa), n, spin_us=0, small_job_bytes=0) for n in POOLS]
    lins = [Linear(w, b, compute_dtype=torch.float32, storage_dtype=torch.bfloat16, pool=p) for p in pools]
    ref_w = w.to(torch.bfloat16).double()
    try:
        for M in (1, 2, 7):
            x = torch.randn(M, K, generator=gen)
            one = lins[0](x)
            ref = x.double() @ ref_w.T + b.double()
            assert ((one.double() - ref).abs().max() / ref.abs().max()) < 2e-2, M
            for lin in lins[1:]:
                for _ in range(20):
                    assert torch.equal(lin(x), one), (isa, M, lin.pool.num_threads)
    finally:
        for p in pools:
            p.close()
