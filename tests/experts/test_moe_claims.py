"""The MoE kernel's work claimed in pieces by whichever pool thread is free (moe.c `claim`,
pool.c `pool_run_claims`): a worker that wakes late or is preempted leaves its pieces to the
others, and the numbers must not depend on who computed what. Checked against float64 references
(formats, activations, the GEMM tiles) and bit for bit across thread counts and repeated calls,
on pools whose workers sleep at once (spin 0: every call a wake-up, so they join late) and on
more threads than cores (preempted mid-call)."""
from __future__ import annotations

import os

import pytest
import torch
from test_cpu_kernels import dense64, make_banks, reference64, rel_err, routes
from test_ggml_banks import mixed_banks

from freetoken import kernels
from freetoken.experts.execution.cpu import CpuExpertExecutor

ISAS = kernels.variants_here()
CORES = len(os.sched_getaffinity(0))
# pieces of 64 gate/up columns and 64 down rows: a ragged last piece each (I = 96 + 64k, H = 200)
SHAPES = {"bf16": (200, 160), "int8": (288, 160), "fp32": (200, 96)}


def executors(banks, fmt, hidden, inter, isa, **kw):
    """One thread (every piece on the caller), two, and more threads than cores, workers that
    never spin (each call wakes them: they often join after the caller has taken pieces)."""
    return [CpuExpertExecutor(banks, fmt, hidden, inter, isa=isa, num_threads=n, spin_us=0, **kw)
            for n in (1, 2, CORES + 1)]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", list(SHAPES))
def test_pieces_match_reference_and_every_thread_count(fmt, isa):
    gen = torch.Generator().manual_seed(39)
    hidden, inter = SHAPES[fmt]
    banks = make_banks(fmt, 6, hidden, inter, True, gen)
    dense = dense64(banks, fmt)
    exs = executors(banks, fmt, hidden, inter, isa, activation="swiglu_oai", gemm_tokens=0)
    try:
        for t, k in ((1, 4), (3, 2), (9, 3)):
            ids, w = routes(t, k, 6, gen)
            x = torch.randn(t, hidden, generator=gen)
            one = exs[0].run(x, ids, w)
            ref = reference64(banks, dense, x, ids, w, "swiglu_oai", quantize_act=fmt == "int8")
            assert rel_err(one, ref) < (4e-3 if fmt == "int8" else 2e-5), (fmt, t, k)
            for ex in exs[1:]:
                for _ in range(20):       # claims interleave differently call to call
                    assert torch.equal(ex.run(x, ids, w), one), (fmt, ex.num_threads, t, k)
    finally:
        for ex in exs:
            ex.close()


@pytest.mark.parametrize("isa", ISAS)
def test_ggml_pieces_with_per_256_activations(isa):
    """Q4_K_M-like banks: h's per-32 part prepared piece by piece in phase 1, its per-256 part in
    phase 1b, also claimed; the same bits from 1, 2 and more threads than cores."""
    gen = torch.Generator().manual_seed(40)
    H, I = 512, 256
    banks, _ = mixed_banks(3, H, I, gen)
    lib = kernels.load(isa)
    exs = executors(banks, "ggml", H, I, isa, gemm_tokens=0)
    try:
        for on in (1, 0):
            assert lib.ft_set_ggml_k256(on) == on
            for T in (1, 5):
                ids = torch.stack([torch.randperm(9, generator=gen)[:4] for _ in range(T)])
                wts = torch.rand(T, 4, generator=gen)
                x = torch.randn(T, H, generator=gen)
                one = exs[0].run(x, ids, wts)
                for ex in exs[1:]:
                    for _ in range(20):
                        assert torch.equal(ex.run(x, ids, wts), one), (isa, on, T, ex.num_threads)
    finally:
        lib.ft_set_ggml_k256(0)
        for ex in exs:
            ex.close()


def test_gemm_tiles_and_pair_rows_in_pieces():
    """bf16 experts with many tokens through the GEMM tiles (packed x claimed in phase 0, packed h
    per piece) and the disk tier's pair rows (`run_pairs` + `combine`): the one-thread bits."""
    gen = torch.Generator().manual_seed(41)
    hidden, inter = 256, 192
    banks = make_banks("bf16", 5, hidden, inter, False, gen)
    exs = executors(banks, "bf16", hidden, inter, "native", gemm_tokens=0)
    try:
        x = torch.randn(40, hidden, generator=gen)
        ids, w = routes(40, 2, 5, gen)
        ids[ids < 0] = 0
        one = exs[0].run(x, ids, w)
        y1 = torch.full((80, hidden), -0.0)
        exs[0].run_pairs(x, ids, y1)
        for ex in exs[1:]:
            for _ in range(10):
                assert torch.equal(ex.run(x, ids, w), one)
                y = torch.full((80, hidden), -0.0)
                ex.run_pairs(x, ids, y)
                assert torch.equal(y, y1)
    finally:
        for ex in exs:
            ex.close()
