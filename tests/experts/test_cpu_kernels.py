"""CPU expert kernels against float64 torch references, on fresh random data every run."""
from __future__ import annotations

import itertools

import pytest
import torch

from freetoken import kernels
from freetoken.experts.execution.cpu import CpuExpertExecutor
from freetoken.experts.formats import activate, dequantize_expert, quantize_banks, spec_format
from freetoken.experts.memory.pool import ExpertSpec
from freetoken.experts.execution.torch_exec import run_experts
from freetoken.quant.fp8 import dequantize_fp8_block, quantize_fp8_block
from freetoken.quant.int8 import dequantize_int8, quantize_int8
from freetoken.quant.mxfp4 import dequantize_mxfp4, quantize_mxfp4

# (hidden, intermediate): odd for float formats (SIMD tails), > 128 and ragged for fp8's
# 128x128 scale blocks, multiples of 32 where the format requires it.
SHAPES = {"fp32": (200, 72), "bf16": (200, 72), "fp16": (136, 40), "fp8": (300, 136),
          "int8": (288, 96), "mxfp4": (288, 96), "nvfp4": (352, 96)}
FLOAT_TOL = 2e-5      # exact activations, fp32 accumulation
QACT_TOL = 4e-2       # int8/mxfp4 quantize activations per 32 like llama.cpp's Q8_0
ISAS = kernels.variants_here()     # native, avx2 on AVX-512 machines, portable


def reference_run(banks, fmt, x, ids, w, act="silu", dtype=torch.float64, limit=7.0):
    """The reference executor in `dtype` over banks in `fmt`."""
    inter = dequantize_expert(banks, fmt, 0)[1].shape[1]
    spec = ExpertSpec(x.shape[1], inter, spec_format(fmt), act, limit=limit)
    return run_experts(banks, spec, ids, x, w, dtype=dtype)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-30)).item()


def make_banks(fmt: str, n: int, hidden: int, inter: int, bias: bool, gen: torch.Generator):
    gu = torch.randn(n, 2 * inter, hidden, generator=gen) * 0.1
    dn = torch.randn(n, hidden, inter, generator=gen) * 0.1
    banks = quantize_banks(gu, dn, fmt)
    if bias:
        banks["gate_up_bias"] = torch.randn(n, 2 * inter, generator=gen)
        banks["down_bias"] = torch.randn(n, hidden, generator=gen)
    return banks


def routes(t: int, k: int, n: int, gen: torch.Generator):
    ids = torch.randint(0, n, (t, k), generator=gen)
    if t >= 3:
        ids[: t // 2 + 1, 0] = 1                 # many tokens share one expert
        ids[1, k - 1] = -1                       # a skipped route
    if t >= 2 and k >= 2:
        ids[t - 1, 1] = ids[t - 1, 0]            # the same expert twice for one token
    return ids, torch.rand(t, k, generator=gen)


# Where a value of h lands within fp32 noise of an int8 rounding tie, the kernel (h in float32) and
# the float64 reference may round it apart: one code step of one element (~2.5e-3 relative, about
# one random draw in 40). The reference marks those elements (within TIE_BAND of a step of a tie)
# and admits exactly that step on the outputs they feed; everything else must agree to fp32 sums.
TIE_BAND = 1e-3


def q8_act(v: torch.Tensor, ties: list | None = None) -> torch.Tensor:
    """The kernels' activation quantization (per 32, scale amax/127, round half to even); with
    `ties`, appends each element's slack: its code step where it lies near a rounding tie, else 0."""
    b = v.float().unflatten(-1, (-1, 32))
    d = b.abs().amax(-1, keepdim=True) / 127.0
    scaled = b * torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    if ties is not None:
        near = ((scaled - scaled.floor()).double() - 0.5).abs() < TIE_BAND
        ties.append(torch.where(near, d.double(), torch.zeros((), dtype=torch.float64)).flatten(-2))
    return (torch.round(scaled) * d).flatten(-2).double()


def dense64(banks, fmt):
    """All experts dequantized to float64 once: (gate_up [N, 2I, H], down [N, H, I])."""
    n = next(iter(banks.values())).shape[0]
    pairs = [dequantize_expert(banks, fmt, e, torch.float64) for e in range(n)]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def reference64(banks, dense, x, ids, w, act, quantize_act=False, alpha=1.702, limit=7.0, slack=None):
    """float64 sum_k w * expert(x); with quantize_act, x and h are quantized like the int8/mxfp4
    kernels do, and `slack` (shaped like the output) gathers what near-tie roundings of h may move."""
    gu_all, dn_all = dense
    inter = dn_all.shape[2]
    qa = q8_act if quantize_act else (lambda v: v.double())
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float64)
    for t in range(ids.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            if e < 0:
                continue
            h = gu_all[e] @ qa(x[t])
            if "gate_up_bias" in banks:
                h = h + banks["gate_up_bias"][e].double()
            a = activate(h[:inter], h[inter:], act, alpha, limit)
            if quantize_act:
                ties = [] if slack is not None else None
                y = dn_all[e] @ q8_act(a.float(), ties)
                if ties:
                    slack[t] += abs(float(w[t, k])) * (dn_all[e].abs() @ ties[0])
            else:
                y = dn_all[e] @ a
            if "down_bias" in banks:
                y = y + banks["down_bias"][e].double()
            out[t] += float(w[t, k]) * y
    return out


def assert_matches_q8(y, banks, dense, x, ids, w, act, limit=7.0, note=()):
    """y equals the int8-activation float64 reference to fp32 sums, up to near-tie roundings."""
    slack = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float64)
    ref = reference64(banks, dense, x, ids, w, act, quantize_act=True, limit=limit, slack=slack)
    excess = ((y.double() - ref).abs() - slack).max().item()
    assert excess < FLOAT_TOL * ref.abs().max().item(), (*note, excess, slack.max().item())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", list(SHAPES))
def test_executor_matches_float64_reference(fmt, isa):
    seed = torch.seed() % (2**31)
    gen = torch.Generator().manual_seed(seed)
    hidden, inter = SHAPES[fmt]
    n = 6
    # silu_clamp (DeepSeek-V4) with a limit small enough that the clamps act
    for act, bias, limit in (("silu", False, 7.0), ("swiglu_oai", True, 7.0), ("silu_clamp", False, 0.05)):
        banks = make_banks(fmt, n, hidden, inter, bias, gen)
        ex = CpuExpertExecutor(banks, fmt, hidden, inter, activation=act, limit=limit, isa=isa, gemm_tokens=0)
        assert ex.isa in ("avx512+vnni+bf16", "avx512+vnni", "avx512", "avx2", "portable") or ex.isa == "torch"
        dense = dense64(banks, fmt)
        for t, k in ((1, 1), (1, 4), (3, 2), (9, 3)):
            ids, w = routes(t, k, n, gen)
            x = torch.randn(t, hidden, generator=gen)
            y = ex.run(x, ids, w)
            ref = reference64(banks, dense, x, ids, w, act, limit=limit)
            if fmt in ("int8", "mxfp4", "nvfp4"):
                # (clamped outputs are small: the int8 activations' relative error is larger there,
                # the check against the kernels' own activation rounding below is what counts)
                assert rel_err(y, ref) < QACT_TOL or act == "silu_clamp", (fmt, act, t, k)
                assert_matches_q8(y, banks, dense, x, ids, w, act, limit, (fmt, act, t, k, seed))
            else:
                assert rel_err(y, ref) < FLOAT_TOL, (fmt, act, t, k)
            if t == 3:   # the torch reference path of cpu.py agrees too
                ref2 = reference_run(banks, fmt, x.double(), ids, w.double(), act, limit=limit, dtype=torch.float64)
                assert rel_err(ref2, ref) < 1e-12
        ex.close()


def test_out_accumulates_and_bf16_input():
    gen = torch.Generator().manual_seed(1)
    banks = make_banks("bf16", 4, 64, 32, False, gen)
    ex = CpuExpertExecutor(banks, "float", 64, 32)
    assert ex.fmt == "bf16"
    x = torch.randn(5, 64, generator=gen).bfloat16()
    ids, w = routes(5, 2, 4, gen)
    base = torch.randn(5, 64, generator=gen)
    out = base.clone()
    assert ex.run(x, ids, w, out) is out
    ref = reference_run(banks, "bf16", x.double(), ids, w.double(), dtype=torch.float64)
    assert rel_err(out - base, ref) < FLOAT_TOL
    assert torch.equal(ex.run(x, torch.full((5, 2), -1), w), torch.zeros(5, 64))


def test_prefill_split_matches_kernel():
    gen = torch.Generator().manual_seed(2)
    banks = make_banks("fp32", 4, 96, 64, True, gen)
    x = torch.randn(24, 96, generator=gen)
    ids, w = routes(24, 2, 4, gen)
    a = CpuExpertExecutor(banks, "fp32", 96, 64, activation="swiglu_oai", gemm_tokens=0).run(x, ids, w)
    b = CpuExpertExecutor(banks, "fp32", 96, 64, activation="swiglu_oai", gemm_tokens=8).run(x, ids, w)
    assert rel_err(a, b) < FLOAT_TOL


@pytest.mark.parametrize("fmt", ["int8", "mxfp4", "nvfp4", "fp8", "bf16"])
def test_prefill_split_dequantizes_exactly(fmt):
    """Experts with many tokens: C dequantization (bit-exact weights) + fp32 GEMM with the
    activations rounded as the streaming kernels round them (experts/execution/numerics.py), so the split
    gives the kernels' answer to fp32 accuracy whatever the token count."""
    gen = torch.Generator().manual_seed(3)
    h, inter = SHAPES[fmt]
    banks = make_banks(fmt, 5, h, inter, True, gen)
    x = torch.randn(30, h, generator=gen)
    ids, w = routes(30, 3, 5, gen)
    ex = CpuExpertExecutor(banks, fmt, h, inter, activation="swiglu_oai", gemm_tokens=1)
    for fid in range(5):
        for got, ref in zip(ex._dequantize(fid), dequantize_expert(banks, fmt, fid)):
            assert torch.equal(got, ref)
    streamed = CpuExpertExecutor(banks, fmt, h, inter, activation="swiglu_oai", gemm_tokens=0)
    assert rel_err(ex.run(x, ids, w), streamed.run(x, ids, w)) < FLOAT_TOL
    streamed.close()


def test_more_threads_than_work_and_pool_spec():
    from freetoken.experts.memory.pool import ExpertPool, ExpertSpec
    gen = torch.Generator().manual_seed(7)
    banks = make_banks("bf16", 4, 48, 32, True, gen)
    pool = ExpertPool(banks, 2, 2, ExpertSpec(48, 32, "float", "swiglu_oai"))
    ex = CpuExpertExecutor.from_pool(pool, num_threads=3)    # I = 32: two threads idle in phase 1
    x = torch.randn(6, 48, generator=gen)
    ids, w = routes(6, 2, 4, gen)
    ref = reference_run(banks, "bf16", x.double(), ids, w.double(), "swiglu_oai", dtype=torch.float64)
    for _ in range(3):
        assert rel_err(ex.run(x, ids, w), ref) < FLOAT_TOL
    ex.close()


def test_bad_expert_id_and_bad_banks():
    gen = torch.Generator().manual_seed(3)
    banks = make_banks("int8", 2, 64, 32, False, gen)
    ex = CpuExpertExecutor(banks, "int8", 64, 32)
    with pytest.raises(IndexError):
        ex.run(torch.randn(1, 64), torch.tensor([[2]]), torch.ones(1, 1))
    with pytest.raises(ValueError):
        CpuExpertExecutor(banks, "int8", 64, 48)
    with pytest.raises(ValueError):
        CpuExpertExecutor(make_banks("mxfp4", 2, 48, 32, False, gen), "mxfp4", 48, 32)


def test_torch_fallback_without_compiler(monkeypatch):
    monkeypatch.setattr(kernels, "_compiler", lambda: None)
    monkeypatch.setattr(kernels, "_loaded", {})
    gen = torch.Generator().manual_seed(4)
    banks = make_banks("fp8", 3, 160, 64, True, gen)
    ex = CpuExpertExecutor(banks, "fp8", 160, 64, activation="swiglu_oai")
    assert ex.isa == "torch"
    x = torch.randn(4, 160, generator=gen)
    ids, w = routes(4, 2, 3, gen)
    ref = reference_run(banks, "fp8", x.double(), ids, w.double(), "swiglu_oai", dtype=torch.float64)
    assert rel_err(ex.run(x, ids, w), ref) < 1e-5


# ---------------------------------------------------------------- format helpers

def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mxfp4_dequant_bit_exact_with_transformers(dtype):
    from transformers.integrations.mxfp4 import _convert_moe_packed_tensors
    gen = torch.Generator().manual_seed(torch.seed() % (2**31))
    blocks = torch.randint(0, 256, (3, 40, 5, 16), dtype=torch.uint8, generator=gen)
    scales = torch.randint(90, 160, (3, 40, 5), dtype=torch.uint8, generator=gen)
    scales[0, 0, :3] = torch.tensor([0, 127, 254], dtype=torch.uint8)
    theirs = _convert_moe_packed_tensors(blocks, scales, dtype=dtype).transpose(1, 2)
    ours = dequantize_mxfp4(blocks, scales, dtype=dtype)
    assert ours.shape == (3, 40, 160) and ours.dtype == dtype
    assert torch.equal(bits(ours), bits(theirs.contiguous()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_dequant_bit_exact_with_transformers(dtype):
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight
    gen = torch.Generator().manual_seed(torch.seed() % (2**31))
    w = (torch.randn(2, 200, 300, generator=gen) * 100).to(torch.float8_e4m3fn)
    s = torch.rand(2, 2, 3, generator=gen) * 1e-2
    theirs = _dequantize_fp8_weight(w, s, [128, 128], dtype)
    assert torch.equal(bits(dequantize_fp8_block(w, s, dtype)), bits(theirs))


def test_fp8_dequant_matches_fp8dequantize_op():
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize
    gen = torch.Generator().manual_seed(5)
    w = (torch.randn(256, 384, generator=gen) * 50).to(torch.float8_e4m3fn)
    s = torch.rand(2, 3, generator=gen)
    theirs = Fp8Dequantize(None)._dequantize_one(w, s, torch.float32)
    assert torch.equal(bits(dequantize_fp8_block(w, s)), bits(theirs))


def test_quantizers_round_trip():
    gen = torch.Generator().manual_seed(6)
    w = torch.randn(64, 256, generator=gen)
    q, s = quantize_int8(w)
    assert q.dtype == torch.int8 and s.shape == (64, 8) and s.dtype == torch.float16
    assert (dequantize_int8(q, s) - w).abs().max() < w.abs().max() / 100
    b, e = quantize_mxfp4(w)
    assert b.shape == (64, 8, 16) and e.shape == (64, 8)
    assert (dequantize_mxfp4(b, e) - w).abs().max() < w.abs().max() / 4
    f, si = quantize_fp8_block(w)
    assert f.dtype == torch.float8_e4m3fn and si.shape == (1, 2)
    assert (dequantize_fp8_block(f, si) - w).abs().max() < w.abs().max() / 16


@pytest.mark.skipif("avx2" not in kernels.variants_here(), reason="no AVX-512 here: one x86 path only")
@pytest.mark.parametrize("fmt", ["int8", "mxfp4"])
def test_vnni_int8_dots_equal_the_avx2_ones(fmt):
    """The int8 dot products (VNNI vpdpbusd on AVX-512 CPUs, maddubs+madd on AVX2) are exact
    integer sums in the same lanes, so both libraries give the same floats."""
    gen = torch.Generator().manual_seed(5)
    hidden, inter = SHAPES[fmt]
    banks = make_banks(fmt, 4, hidden, inter, False, gen)
    wide = CpuExpertExecutor(banks, fmt, hidden, inter, isa="native", gemm_tokens=0)
    narrow = CpuExpertExecutor(banks, fmt, hidden, inter, isa="avx2", gemm_tokens=0)
    ids, w = routes(5, 2, 4, gen)
    x = torch.randn(5, hidden, generator=gen)
    assert torch.equal(wide.run(x, ids, w), narrow.run(x, ids, w))


def bf16_act(v: torch.Tensor) -> torch.Tensor:
    """The bf16-dot kernels' activation rounding (to bf16, nearest even), in float64."""
    return v.float().bfloat16().double()


def rounded_reference(banks, dense, x, ids, w, inter, rel=1e-4, eps=1e-6, act="swiglu_oai"):
    """float64 reference with x and the activation h rounded to bf16, and a per-element slack
    for h values so close to a bf16 rounding boundary (within rel * |h| + eps) that the kernel's
    float32 sums may round them the other way: each such tie adds w * ulp(h) * |down column|."""
    gu_all, dn_all = dense
    out = torch.zeros(x.shape, dtype=torch.float64)
    slack = torch.zeros(x.shape, dtype=torch.float64)
    for i in range(ids.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[i, j])
            if e < 0:
                continue
            h = gu_all[e] @ bf16_act(x[i]) + banks["gate_up_bias"][e].double()
            a = activate(h[:inter], h[inter:], act, 1.702, 7.0)
            d = rel * a.abs() + eps
            ulp = (bf16_act(a + d) - bf16_act(a - d)).abs()          # 0 unless a tie is possible
            out[i] += float(w[i, j]) * (dn_all[e] @ bf16_act(a) + banks["down_bias"][e].double())
            slack[i] += float(w[i, j]) * (dn_all[e].abs() @ ulp)
    return out, slack


@pytest.mark.parametrize("isa", ISAS)
def test_bf16_dot_matches_float64_reference_of_rounded_activations(isa):
    """bf16 banks with the vdpbf16ps switch on (emulated where the variant lacks it): equal to the
    float64 reference whose x and h are rounded to bf16, on odd shapes (masked tails), one thread
    and two (each thread's rows end in a partial tile at 33 and 67)."""
    gen = torch.Generator().manual_seed(torch.seed() % (2**31))
    lib = kernels.load(isa)
    for (hidden, inter), threads in itertools.product(((200, 72), (2048, 96), (67, 33)), (1, 2)):
        banks = make_banks("bf16", 6, hidden, inter, True, gen)
        ex = CpuExpertExecutor(banks, "bf16", hidden, inter, activation="swiglu_oai", isa=isa, gemm_tokens=0,
                               num_threads=threads)
        dense = dense64(banks, "bf16")
        try:
            assert lib.ft_set_bf16_dot(1) == (2 if ex.isa.endswith("+bf16") else 1)
            for t, k in ((1, 1), (1, 4), (3, 2), (9, 3)):
                ids, w = routes(t, k, 6, gen)
                x = torch.randn(t, hidden, generator=gen)
                y = ex.run(x, ids, w)
                exact = reference64(banks, dense, x, ids, w, "swiglu_oai")
                rounded, slack = rounded_reference(banks, dense, x, ids, w, inter)
                scale = rounded.abs().max()
                assert ((y.double() - rounded).abs() <= 1e-4 * scale + slack).all(), (hidden, t, k)
                assert rel_err(y, exact) < 2e-2, (hidden, t, k)          # bf16 activations, as llama.cpp's
        finally:
            lib.ft_set_bf16_dot(0)
            ex.close()
