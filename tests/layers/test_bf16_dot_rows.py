"""The bf16-dot GEMV (bf16 weights x bf16-rounded activations; vdpbf16ps where the build has it,
emulated in the others) at every row count of a decode or verify step: each row count takes its
own shape of the dense GEMV's tiles (kernels/c/bf16dot.c: one pass of up to 6 tokens over 4
weight rows or of 7-9 over 3, more tokens in equal passes, the prefetch by the passes), so every
count up to 16 and the largest verify are checked against a float64 reference of the (rounded)
activations, and against the same rows run one at a time (a verify's rows must have a plain
step's bits), in every kernel build this CPU runs, with the bf16 dots on and off."""
import pytest
import torch

from freetoken import kernels
from freetoken.kernels.pool import CpuPool
from freetoken.layers.kernel_rows import GEMV_TOKENS
from freetoken.layers.linear import Linear

ROWS = (*range(1, 17), 24, GEMV_TOKENS)
# weight rows not a multiple of the 4- or 3-row tiles nor of the threads' 16-row units; a column
# tail after whole 32-pair steps (75, 2085), one step exactly (32), fewer than a step (5)
SHAPES = ((37, 75), (70, 2085), (19, 32), (6, 5))


@pytest.fixture(params=[(v, on) for v in kernels.variants_here() for on in (1, 0)],
                ids=lambda p: f"{p[0]}-bf16dot{'on' if p[1] else 'off'}")
def dot_pool(request):
    variant, on = request.param
    lib = kernels.load(variant)
    pool = CpuPool(lib, 2, small_job_bytes=0)       # the threads split even these small shapes
    lib.ft_set_bf16_dot(on)
    pool.bf16_dot = bool(on)
    yield pool
    lib.ft_set_bf16_dot(0)
    pool.close()


@pytest.mark.parametrize("bias", [False, True])
def test_every_row_count_matches_float64_of_rounded_activations_and_one_row_steps(dot_pool, bias):
    g = torch.Generator().manual_seed(11)
    for N, K in SHAPES:
        w = torch.randn(N, K, generator=g)
        b = torch.randn(N, generator=g) if bias else None
        lin = Linear(w, b, compute_dtype=torch.float32, storage_dtype=torch.bfloat16, pool=dot_pool)
        ref_w = w.bfloat16().double()
        x = torch.randn(max(ROWS), K, generator=g)
        one = torch.cat([lin(x[i:i + 1]) for i in range(x.shape[0])])
        for M in ROWS:
            y = lin(x[:M])
            xr = x[:M].bfloat16().double() if dot_pool.bf16_dot else x[:M].double()
            ref = xr @ ref_w.T + (b.double() if bias else 0)
            err = (y.double() - ref).abs().max() / ref.abs().max()
            assert err < 1e-5, (N, K, M, float(err))
            assert torch.equal(y, one[:M]), (N, K, M)
