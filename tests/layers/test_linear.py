"""Dense linear layers on the C kernels vs a float64 torch reference of the stored weights."""
import pytest
import torch

from freetoken import kernels
from freetoken.kernels.pool import CpuPool, shared_pool
from freetoken.layers.kernel_rows import GEMV_TOKENS
from freetoken.layers.linear import Linear
from freetoken.quant.int8 import dequantize_int8, quantize_int8


def _stored(w: torch.Tensor, storage: torch.dtype, fmt: str | None) -> torch.Tensor:
    """The weight exactly as the layer holds it, in float64."""
    if fmt == "int8":
        return dequantize_int8(*quantize_int8(w), torch.float64)
    return w.to(storage).double()


@pytest.mark.parametrize("isa", kernels.variants_here())
@pytest.mark.parametrize("storage,fmt,K", [(torch.bfloat16, None, 75), (torch.float16, None, 64),
                                           (torch.float32, None, 33), (torch.bfloat16, "int8", 96)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_float64_reference(isa, storage, fmt, K, bias):
    g = torch.Generator().manual_seed(K)
    N = 37                                    # not a multiple of the row tiles or of the thread split
    w = torch.randn(N, K, generator=g)
    b = torch.randn(N, generator=g) if bias else None
    pool = CpuPool(kernels.load(isa), 2, small_job_bytes=0)     # split even these small shapes
    lin = Linear(w, b, compute_dtype=torch.float32, storage_dtype=storage, fmt=fmt, pool=pool)
    assert lin.pool is pool
    ref_w = _stored(w, storage, fmt)
    for M in (1, 2, 3, 5, GEMV_TOKENS, GEMV_TOKENS + 1, 40):   # GEMV tiles and the dequantize+GEMM path
        x = torch.randn(M, K, generator=g)
        ref = x.double() @ ref_w.T + (b.double() if bias else 0)
        tol = 2e-2 if fmt == "int8" else 2e-5       # int8 quantizes activations per 32 in the GEMV
        err = (lin(x).double() - ref).abs().max() / ref.abs().max()
        assert err < tol, (M, float(err))
    pool.close()


def test_dequantized_is_bit_exact_and_batched_shapes_pass_through():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(70, 64, generator=g)
    for storage, fmt in ((torch.bfloat16, None), (torch.float16, None), (torch.float32, "int8")):
        lin = Linear(w, compute_dtype=torch.float32, storage_dtype=storage, fmt=fmt, pool=shared_pool())
        assert torch.equal(lin.dequantized(), _stored(w, storage, fmt).float())
    lin = Linear(w, compute_dtype=torch.bfloat16, storage_dtype=torch.bfloat16, pool=shared_pool())
    x = torch.randn(2, 3, 64, generator=g).to(torch.bfloat16)
    y = lin(x)
    assert y.shape == (2, 3, 70) and y.dtype == torch.bfloat16
    ref = x.double() @ w.to(torch.bfloat16).double().T
    assert ((y.double() - ref).abs().max() / ref.abs().max()) < 1e-2   # bf16 output rounding


def test_torch_path_without_pool_and_int8_numerics_match():
    g = torch.Generator().manual_seed(2)
    w, x = torch.randn(40, 64, generator=g), torch.randn(GEMV_TOKENS + 4, 64, generator=g)
    plain = Linear(w, compute_dtype=torch.float32, fmt="int8")           # e.g. CUDA: dequantized at load
    fast = Linear(w, compute_dtype=torch.float32, fmt="int8", pool=shared_pool())
    assert plain.pool is None and torch.equal(plain.weight, dequantize_int8(*quantize_int8(w)))
    torch.testing.assert_close(plain(x), fast(x), rtol=1e-5, atol=1e-5)   # both: exact weights, fp32 GEMM
    with pytest.raises(ValueError, match="dense_format"):
        Linear(w, compute_dtype=torch.float32, fmt="int4")


def test_native_bf16_prefill_gemm_matches_reference():
    """gemm_dtype=bf16 (chosen where torch's bf16 GEMM is measured faster): prefill-sized inputs
    are rounded to bf16, the bf16 weight is used as stored, the output comes back rounded to bf16
    (torch has no bf16 x bf16 -> fp32 GEMM on the CPU); decode sizes keep the fp32 GEMV."""
    g = torch.Generator().manual_seed(3)
    w, b = torch.randn(50, 96, generator=g), torch.randn(50, generator=g)
    lin = Linear(w, b, compute_dtype=torch.float32, storage_dtype=torch.bfloat16, pool=shared_pool(),
                 gemm_dtype=torch.bfloat16)
    ref_w = w.bfloat16().double()
    for M in (1, GEMV_TOKENS + 1, 300):
        x = torch.randn(M, 96, generator=g)
        y = lin(x)
        assert y.dtype == torch.float32
        ref = x.double() @ ref_w.T + b.double()
        rounded = x.bfloat16().double() @ ref_w.T + b.double()
        assert ((y.double() - ref).abs().max() / ref.abs().max()) < 1e-2
        if M > GEMV_TOKENS:
            assert ((y.double() - rounded).abs().max() / rounded.abs().max()) < 8e-3    # one bf16 rounding
        else:
            assert ((y.double() - ref).abs().max() / ref.abs().max()) < 2e-5


@pytest.mark.parametrize("isa", kernels.variants_here())
def test_bf16_dot_gemv_matches_float64_reference_of_rounded_activations(isa):
    """The vdpbf16ps switch (emulated where the variant lacks it) on bf16 weights: x rounded to
    bf16, then exact products summed in fp32."""
    g = torch.Generator().manual_seed(5)
    lib = kernels.load(isa)
    pool = CpuPool(lib, 2, small_job_bytes=0)
    try:
        lib.ft_set_bf16_dot(1)
        for N, K in ((37, 75), (9, 2048), (64, 33), (5, 1)):
            w = torch.randn(N, K, generator=g)
            lin = Linear(w, None, compute_dtype=torch.float32, storage_dtype=torch.bfloat16, pool=pool)
            ref_w = w.bfloat16().double()
            for M in (1, 2, 3, 4, 5, 9):
                x = torch.randn(M, K, generator=g)
                ref = x.bfloat16().double() @ ref_w.T
                err = (lin(x).double() - ref).abs().max() / ref.abs().max()
                assert err < 1e-5, (N, K, M, float(err))
    finally:
        lib.ft_set_bf16_dot(0)
        pool.close()


@pytest.mark.skipif("avx2" not in kernels.variants_here(), reason="no AVX-512 build beside the AVX2 one here")
@pytest.mark.parametrize("storage", [torch.bfloat16, torch.float16, torch.float32])
def test_avx512_float_tiles_have_the_avx2_tiles_bits(storage):
    """The AVX-512 build's zmm tiles (4 rows x up to 4 tokens, half the FMAs) sum every dot as
    the AVX2 build's two 8-lane chains do: equal bits at every verify size, K with a tail."""
    g = torch.Generator().manual_seed(7)
    N, K = 37, 75
    w = torch.randn(N, K, generator=g)
    pools = [CpuPool(kernels.load(isa), 2, small_job_bytes=0) for isa in ("native", "avx2")]
    wide, narrow = (Linear(w, compute_dtype=torch.float32, storage_dtype=storage, pool=p) for p in pools)
    for M in range(1, 11):
        x = torch.randn(M, K, generator=g)
        assert torch.equal(wide(x), narrow(x)), M
    for p in pools:
        p.close()
