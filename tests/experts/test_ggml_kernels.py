"""The C kernels on "ggml" banks (llama.cpp block types, a type per expert tensor) against float64
torch math on the dequantized weights, in every kernel variant this CPU runs."""
from __future__ import annotations

import pytest
import torch
from test_cpu_kernels import ISAS, assert_matches_q8, dense64, reference64, rel_err, routes
from test_ggml_banks import mixed_banks

from freetoken import kernels
from freetoken.experts.execution.cpu import CpuExpertExecutor
from freetoken.experts.formats import dequantize_expert
from freetoken.experts.ggml_banks import KERNEL_TYPES, quantize_ggml
from freetoken.quant import ggml_quants as gq
from freetoken.quant.ggml_iquants import TYPES as I_QUANTS

H, I = 512, 256

QUANTIZED = [t for t in KERNEL_TYPES if t not in I_QUANTS]   # i-quants (no quantizer here): *_iq tests


def check(banks, n, isa, gen, act="silu", bias=False):
    if bias:
        banks = dict(banks, gate_up_bias=torch.randn(n, 2 * I, generator=gen),
                     down_bias=torch.randn(n, H, generator=gen))
    ex = CpuExpertExecutor(banks, "ggml", H, I, activation=act, isa=isa, gemm_tokens=0)
    dense = dense64(banks, "ggml")
    for t, k in ((1, 1), (1, 4), (2, 3), (3, 2), (9, 3)):    # 1..4 tokens per expert tile
        ids, w = routes(t, k, n, gen)
        x = torch.randn(t, H, generator=gen)
        y = ex.run(x, ids, w)
        # the kernels round activations per 32 to int8 (llama.cpp's Q8_0): exact up to fp32 sums
        # against that, close to the unrounded float64 result
        assert_matches_q8(y, banks, dense, x, ids, w, act, note=(t, k))
        assert rel_err(y, reference64(banks, dense, x, ids, w, act)) < 4e-2, (t, k)
    ex.close()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("t", QUANTIZED, ids=gq.type_name)
def test_each_type_matches_float64_reference(t, isa):
    gen = torch.Generator().manual_seed(torch.seed() % (2**31))
    n = 5                                                      # odd expert count
    banks = quantize_ggml(torch.randn(n, 2 * I, H, generator=gen) * 0.1, torch.randn(n, H, I, generator=gen) * 0.1, t)
    check(banks, n, isa, gen)


@pytest.mark.parametrize("isa", ISAS)
def test_mixed_types_per_layer_and_half(isa):
    """Q4_K_M-like banks: gate/up/down of different types, rows padded to the widest, a tile
    mixing gate and up rows of different types; biases and gpt-oss's activation too."""
    gen = torch.Generator().manual_seed(torch.seed() % (2**31))
    banks, _ = mixed_banks(3, H, I, gen)
    check(banks, 9, isa, gen)
    check(banks, 9, isa, gen, act="swiglu_oai", bias=True)


def test_random_valid_blocks():
    """Random bytes (finite scales) rather than quantized Gaussians: every bit pattern of the
    nibbles, high bits and 6-bit scales reaches the kernels."""
    gen = torch.Generator().manual_seed(torch.seed() % (2**31))
    for t in KERNEL_TYPES:
        gu = torch.stack([gq.random_rows(t, 2 * I, H, gen) for _ in range(3)])
        dn = torch.stack([gq.random_rows(t, H, I, gen) for _ in range(3)])
        for b, cols in ((gu, H), (dn, I)):   # tame the scales so values stay O(1)
            if t == gq.MXFP4:
                b.view(*b.shape[:2], -1, 17)[..., 0] = torch.randint(118, 128, b.shape[:2] + (cols // 32,),
                                                                     dtype=torch.uint8, generator=gen)
        banks = {"gate": gu[:, :I].contiguous(), "up": gu[:, I:].contiguous(), "gate_up_types": torch.full((3, 2), t, dtype=torch.int32),
                 "down": dn, "down_types": torch.full((3, 1), t, dtype=torch.int32)}
        dense = dense64(banks, "ggml")
        scale = dense[0].abs().max()
        banks_n = dict(banks)
        ex = CpuExpertExecutor(banks_n, "ggml", H, I, gemm_tokens=0)
        x = torch.randn(4, H, generator=gen) / float(scale) / H ** 0.5
        ids, w = routes(4, 2, 3, gen)
        y = ex.run(x, ids, w)
        ref = reference64(banks, dense, x, ids, w, "silu", quantize_act=True)
        assert torch.isfinite(y).all() and rel_err(y, ref) < 2e-3, gq.type_name(t)


@pytest.mark.skipif("avx2" not in kernels.variants_here(), reason="no AVX-512 here: one x86 path only")
def test_vnni_dots_equal_the_avx2_ones():
    gen = torch.Generator().manual_seed(5)
    banks, _ = mixed_banks(3, H, I, gen)
    ids, w = routes(5, 2, 9, gen)
    x = torch.randn(5, H, generator=gen)
    a = CpuExpertExecutor(banks, "ggml", H, I, isa="native", gemm_tokens=0).run(x, ids, w)
    b = CpuExpertExecutor(banks, "ggml", H, I, isa="avx2", gemm_tokens=0).run(x, ids, w)
    assert torch.equal(a, b)


def test_types_without_a_kernel_fall_back_to_torch():
    from freetoken.experts.execution.host_exec import TorchHostExecutor, make_host_executor
    from freetoken.experts.memory.pool import ExpertPool, ExpertSpec
    gen = torch.Generator().manual_seed(6)
    banks = quantize_ggml(torch.randn(2, 2 * I, H, generator=gen), torch.randn(2, H, I, generator=gen), gq.IQ4_XS)
    with pytest.raises(NotImplementedError, match="IQ4_XS"):
        CpuExpertExecutor(banks, "ggml", H, I)
    assert isinstance(make_host_executor(ExpertPool(banks, 1, 2, ExpertSpec(H, I, "ggml"))), TorchHostExecutor)


@pytest.mark.parametrize("isa", ISAS)
def test_prefill_gemm_path_dequantizes_in_c(isa):
    """Experts above gemm_tokens run dequantize + GEMM: the C row dequantization of ggml banks
    equals the bit-exact torch one, and with the activations rounded as the streaming kernels
    round them (experts/execution/numerics.py: int8 per 32) the result is the kernels' answer to fp32
    accuracy, whatever the token count."""
    gen = torch.Generator().manual_seed(11)
    banks, _ = mixed_banks(3, H, I, gen)
    n = banks["gate"].shape[0]
    ex = CpuExpertExecutor(banks, "ggml", H, I, isa=isa, gemm_tokens=1)
    for fid in (0, n - 1):
        got, want = ex._dequantize(fid), dequantize_expert(banks, "ggml", fid)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    ids, w = routes(9, 3, n, gen)
    x = torch.randn(9, H, generator=gen)
    streamed = CpuExpertExecutor(banks, "ggml", H, I, isa=isa, gemm_tokens=0)
    assert rel_err(ex.run(x, ids, w), streamed.run(x, ids, w)) < 1e-5
    streamed.close()
    ex.close()
