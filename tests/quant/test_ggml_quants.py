"""ggml block codecs: dequantization bit-exact to the gguf package's reference, on random valid
blocks (random bytes with finite fp16 scales are valid blocks of every type here)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken.quant import ggml_quants as gq

gguf = pytest.importorskip("gguf")

TYPES = [gq.Q8_0, gq.Q4_0, gq.Q4_1, gq.Q5_0, gq.Q5_1, gq.IQ4_NL, gq.MXFP4, gq.Q2_K, gq.Q3_K, gq.Q4_K,
         gq.Q5_K, gq.Q6_K, gq.IQ4_XS, gq.TQ1_0, gq.TQ2_0, gq.F16, gq.BF16, gq.F32]


@pytest.mark.parametrize("t", TYPES, ids=gq.type_name)
def test_dequantize_bit_exact_with_gguf(t):
    gen = torch.Generator().manual_seed(torch.seed() % (2**31))
    raw = gq.random_rows(t, 5, 768, gen)
    with np.errstate(over="ignore"):
        ref = np.asarray(gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType(t)), dtype=np.float32)
    ours = gq.dequantize(raw, t, 768)
    assert ours.dtype == torch.float32 and ours.shape == (5, 768)
    assert np.array_equal(ours.numpy().view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("t", [t for t in TYPES if t not in gq.FLOAT_TYPES and t != gq.MXFP4], ids=gq.type_name)
def test_dequantize_bit_exact_at_extreme_scales(t):
    """Every fp16 scale of the blocks set to the extremes: the largest finite (65504, both
    signs), the smallest subnormal and zero; bit-exact to gguf.quants on every block."""
    gen = torch.Generator().manual_seed(7)
    raw = gq.random_rows(t, 4, 512, gen)
    blk = raw.view(4, -1, gq.block_bytes(t))
    for k, h in enumerate((0x7BFF, 0xFBFF, 0x0001, 0x8001, 0x0000, 0x3C00)):
        for off in gq._F16_AT[t]:
            blk[:, k::6, off] = h & 0xFF
            blk[:, k::6, off + 1] = h >> 8
    with np.errstate(over="ignore", invalid="ignore"):
        ref = np.asarray(gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType(t)), dtype=np.float32)
    ours = gq.dequantize(raw, t, 512)
    assert np.array_equal(ours.numpy().view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("t", TYPES, ids=gq.type_name)
def test_quantize_gives_valid_close_blocks(t):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 4, 512, generator=gen)
    q = gq.quantize(x, t)
    assert q.dtype == torch.uint8 and q.shape == (3, 4, gq.row_bytes(t, 512))
    back = gq.dequantize(q, t, 512)
    ref = np.asarray(gguf.quants.dequantize(q.numpy(), gguf.GGMLQuantizationType(t)), dtype=np.float32)
    assert np.array_equal(back.numpy(), ref)
    # (MXFP4: ggml's scale choice clips the top of a block to 1.5 * 2^floor(log2 amax))
    # (ternary TQ*: the error of rounding to {-d, 0, d} is up to half the block's amax)
    bits = {gq.Q8_0: 8, gq.Q6_K: 6, gq.Q5_K: 5, gq.Q5_0: 5, gq.Q5_1: 5, gq.F16: 11, gq.BF16: 8, gq.F32: 24,
            gq.MXFP4: 3, gq.Q3_K: 3, gq.Q2_K: 2, gq.TQ1_0: 2, gq.TQ2_0: 2}.get(t, 4)
    assert (back - x).abs().max() <= x.abs().max() * 2.0 ** (1 - bits) * 1.1


def test_padded_rows_and_sizes():
    x = torch.randn(2, 256)
    q = gq.quantize(x, gq.Q4_K)
    padded = torch.nn.functional.pad(q, (0, 66))        # a Q6_K-wide bank row
    assert torch.equal(gq.dequantize(padded, gq.Q4_K, 256), gq.dequantize(q, gq.Q4_K, 256))
    assert gq.row_bytes(gq.Q6_K, 512) == 420 and gq.block_elems(gq.Q8_0) == 32 and gq.block_bytes(gq.MXFP4) == 17
    for t in TYPES:
        assert (gq.block_elems(t), gq.block_bytes(t)) == gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(t)]


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="ggml type 9"):   # Q8_1: activations only
        gq.row_bytes(9, 32)
    with pytest.raises(ValueError, match="multiple of 256"):
        gq.row_bytes(gq.Q4_K, 96)
    with pytest.raises(ValueError, match="need 34 bytes"):
        gq.dequantize(torch.zeros(1, 20, dtype=torch.uint8), gq.Q8_0, 32)
