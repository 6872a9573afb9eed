"""The AMX decode GEMV over bf16 weights (kernels/c/amx_gemv.c, switched by ft_set_gemv_amx):
against a float64 reference of bf16(x) @ W^T (+ bias), tail shapes included, and batch invariant:
a row's bits the same alone (a plain decode step) as among 2..GEMV_TOKENS rows (a verify)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from freetoken import kernels
from freetoken.kernels.pool import CpuPool
from freetoken.layers.kernel_rows import GEMV_TOKENS
from freetoken.layers.linear import Linear

LIB = kernels.load()
if LIB is None or not LIB.ft_amx_ready():
    pytest.skip("AMX tiles do not run here (no amx_bf16, or the OS refuses the tile state)", allow_module_level=True)


@pytest.fixture(scope="module")
def threads():
    p = CpuPool(LIB, 2, pin=False, small_job_bytes=0)     # two threads even on tiny layers
    yield p
    p.close()


@pytest.fixture
def pool(threads, gemv_dots):
    """The pool with the AMX GEMV switched on (after conftest's gemv_dots turned it off)."""
    assert LIB.ft_set_gemv_amx(1) == 1
    yield threads
    LIB.ft_set_gemv_amx(0)


def linear(pool, n: int, k: int, bias: bool, g: torch.Generator) -> tuple[Linear, torch.Tensor, torch.Tensor | None]:
    w = torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    return Linear(w, b, compute_dtype=torch.float32, storage_dtype=torch.bfloat16, pool=pool), w, b


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    y = x.bfloat16().double() @ w.bfloat16().double().T
    return y if b is None else y + b.double()


@pytest.mark.parametrize("n,k", [(16, 32), (37, 75), (5, 1), (3, 2048), (64, 33), (300, 96), (40, 4096)])
def test_matches_float64_reference_of_bf16_activations(pool, n, k):
    g = torch.Generator().manual_seed(n * 7 + k)
    for bias in (False, True):
        lin, w, b = linear(pool, n, k, bias, g)
        for m in (1, 2, 15, 16, 17, 33, GEMV_TOKENS):
            x = torch.randn(m, k, generator=g)
            ref = reference(x, w, b)
            err = (lin(x).double() - ref).abs().max() / ref.abs().max()
            assert err < 1e-5, (n, k, m, bias, float(err))


def test_bf16_activations_take_the_same_path(pool):
    """bf16 inputs (no rounding left to do) give the fp32 inputs' bits (the layer returns them
    in the input's dtype)."""
    g = torch.Generator().manual_seed(2)
    lin, _, _ = linear(pool, 37, 75, True, g)
    x = torch.randn(9, 75, generator=g).bfloat16()
    assert torch.equal(lin(x), lin(x.float()).bfloat16())


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])   # one switch for all
@given(n=st.integers(1, 70), k=st.integers(1, 200), m=st.integers(2, GEMV_TOKENS), seed=st.integers(0, 2**31 - 1))
def test_rows_are_one_row_steps(pool, n, k, m, seed):
    g = torch.Generator().manual_seed(seed)
    lin, _, _ = linear(pool, n, k, seed % 2 == 0, g)
    x = torch.randn(m, k, generator=g)
    y = lin(x)
    for i in torch.randperm(m, generator=g)[:4].tolist():      # a few rows alone, at any column of its tile
        assert torch.equal(y[i:i + 1], lin(x[i:i + 1])), (n, k, m, i)
    assert torch.equal(y[:m // 2], lin(x[:m // 2]))


def test_off_switch_returns_the_dot_tiles(pool):
    """ft_set_gemv_amx(0) runs the dot tiles again (fp32 activations: not the rounded ones)."""
    g = torch.Generator().manual_seed(4)
    lin, w, _ = linear(pool, 33, 64, False, g)
    x = torch.randn(3, 64, generator=g)
    exact = x.double() @ w.bfloat16().double().T
    try:
        LIB.ft_set_gemv_amx(0)
        assert ((lin(x).double() - exact).abs().max() / exact.abs().max()) < 1e-6
    finally:
        LIB.ft_set_gemv_amx(1)
    assert not torch.equal(lin(x).double(), exact)
