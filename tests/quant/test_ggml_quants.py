"""ggml block codecs: dequantization bit-exact to the gguf package's reference, on random valid
blocks (random bytes with finite fp16 scales are valid blocks of every type here)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken.quant import ggml_quants as gq

gguf = pytest.importorskip("gguf")

TYPES = [gq.Q8_0, gq.Q4_0, gq.MXFP4, gq.Q4_K, gq.Q5_K, gq.Q6_K, gq.IQ4_XS, gq.F16, gq.BF16, gq.F32]
@pytest.mark.parametrize("t", TYPES, ids=gq.type_name)
def test_dequantize_bit_exact_with_gguf(t):
    gen = torch.Generator().manual_seed(torch.seed() % (2**31))
    raw = gq.random_rows(t, 5, 768, gen)
    with np.errstate(over="ignore"):
        ref = np.asarray(gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType(t)), dtype=np.float32)
    ours = gq.dequantize(raw, t, 768)
    assert ours.dtype == torch.float32 and ours.shape == (5, 768)
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
    bits = {gq.Q8_0: 8, gq.Q6_K: 6, gq.Q5_K: 5, gq.F16: 11, gq.BF16: 8, gq.F32: 24, gq.MXFP4: 3}.get(t, 4)
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
    with pytest.raises(ValueError, match="ggml type 3"):
        gq.row_bytes(3, 32)
    with pytest.raises(ValueError, match="multiple of 256"):
        gq.row_bytes(gq.Q4_K, 96)
    with pytest.raises(ValueError, match="need 34 bytes"):
        gq.dequantize(torch.zeros(1, 20, dtype=torch.uint8), gq.Q8_0, 32)
