"""The C kernels on expert banks of llama.cpp's lattice i-quants (IQ1_S .. IQ3_S, kernels/c/ggml_iq.c)
against float64 torch math on the rows dequantized (bit-exact to gguf.quants, see
tests/quant/test_ggml_iquants.py), 1..11 tokens, in every kernel variant this CPU runs."""
from __future__ import annotations

import pytest
import torch
from test_cpu_kernels import ISAS, assert_matches_q8, dense64, reference64, rel_err, routes

from freetoken.experts.execution.cpu import CpuExpertExecutor
from freetoken.experts.formats import dequantize_expert
from freetoken.experts.ggml_banks import KERNEL_TYPES
from freetoken.quant import ggml_iquants as iq
from freetoken.quant import ggml_quants as gq

H, I = 512, 256


def iq_banks(n: int, types: tuple[int, int, int], gen: torch.Generator, scale: float = 0.004) -> dict:
    """n experts of random valid blocks, gate / up / down in their own types (banks of
    their own widths), fp16 d = scale (values O(0.1)); the first expert's d random (every scale bit)."""
    g, u, d = types

    def rows(t, r, cols):
        out = torch.stack([iq.random_rows(t, r, cols, gen, scale=scale) if t in iq.TYPES
                           else gq.quantize(torch.randn(r, cols, generator=gen) * 0.1, t) for _ in range(n)])
        if t in iq.TYPES:
            out[0] = iq.random_rows(t, r, cols, gen)
            v = gq.dequantize(out[0], t, cols)                 # rescale: keep d's bits, tame the size
            out[0] = out[0] if float(v.abs().max()) < 10 else iq.random_rows(t, r, cols, gen, scale=scale)
        return out
    return {"gate": rows(g, I, H).contiguous(), "up": rows(u, I, H).contiguous(),
            "gate_up_types": torch.tensor([[g, u]] * n, dtype=torch.int32),
            "down": rows(d, H, I).contiguous(),
            "down_types": torch.tensor([[d]] * n, dtype=torch.int32)}


def check(banks, isa, gen, tokens=range(1, 12)):
    n = banks["gate"].shape[0]
    ex = CpuExpertExecutor(banks, "ggml", H, I, isa=isa, gemm_tokens=0)
    dense = dense64(banks, "ggml")
    for t in tokens:                                # 1..11 tokens: tiles of 1-4 tokens per expert
        ids, w = routes(t, 2, n, gen)
        x = torch.randn(t, H, generator=gen)
        y = ex.run(x, ids, w)
        assert torch.isfinite(y).all()
        # activations rounded per 32 to int8 as llama.cpp's: exact up to fp32 sums against that
        assert_matches_q8(y, banks, dense, x, ids, w, "silu", note=(t,))
        assert rel_err(y, reference64(banks, dense, x, ids, w, "silu")) < 5e-2, t
    ex.close()


def test_i_quants_have_kernels():
    assert set(iq.TYPES) <= set(KERNEL_TYPES)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("t", iq.TYPES, ids=gq.type_name)
def test_each_type_matches_float64_reference(t, isa):
    gen = torch.Generator().manual_seed(torch.seed() % (2**31))
    check(iq_banks(5, (t, t, t), gen), isa, gen)


@pytest.mark.parametrize("isa", ISAS)
def test_mixed_i_and_k_quants(isa):
    """A dynamic-mix expert: gate, up and down in different types, a tile mixing gate and up rows
    of an i-quant and a k-quant."""
    gen = torch.Generator().manual_seed(torch.seed() % (2**31))
    for types in ((iq.IQ2_XXS, iq.IQ3_XXS, iq.IQ1_S), (gq.Q4_K, iq.IQ2_XS, iq.IQ3_S),
                  (iq.IQ1_M, iq.IQ2_S, gq.Q6_K)):
        check(iq_banks(4, types, gen), isa, gen, tokens=(1, 4, 11))


@pytest.mark.parametrize("isa", ISAS)
def test_prefill_gemm_path_dequantizes_in_c(isa):
    """Experts over gemm_tokens: the C row dequantization equals the bit-exact torch one, and the
    result is the streaming kernels' up to fp32 sums (which can move an int8 rounding tie of the
    intermediate activation by one step: 1e-3)."""
    gen = torch.Generator().manual_seed(11)
    banks = iq_banks(3, (iq.IQ2_XXS, iq.IQ1_M, iq.IQ3_XXS), gen)
    banks2 = iq_banks(3, (iq.IQ2_S, iq.IQ3_S, iq.IQ2_XS), gen)
    banks3 = iq_banks(3, (iq.IQ1_S, iq.IQ1_S, iq.IQ1_M), gen)
    for b in (banks, banks2, banks3):
        ex = CpuExpertExecutor(b, "ggml", H, I, isa=isa, gemm_tokens=1)
        for fid in range(3):
            got, want = ex._dequantize(fid), dequantize_expert(b, "ggml", fid)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        ids, w = routes(9, 2, 3, gen)
        x = torch.randn(9, H, generator=gen)
        streamed = CpuExpertExecutor(b, "ggml", H, I, isa=isa, gemm_tokens=0)
        assert rel_err(ex.run(x, ids, w), streamed.run(x, ids, w)) < 1e-3
        streamed.close()
        ex.close()
