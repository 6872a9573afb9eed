"""The lattice i-quants (IQ1_S .. IQ3_S): dequantization bit-exact to the gguf package's reference
on random valid blocks (every index, sign and sub-scale bit pattern; fp16 scales from the
smallest subnormal to the largest finite), sizes as gguf's, and the C kernels' grid header equal
to what its generator writes from gguf.quants."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken.kernels import gen_iq_grids
from freetoken.quant import ggml_iquants as iq
from freetoken.quant import ggml_quants as gq

gguf = pytest.importorskip("gguf")


def reference(raw: torch.Tensor, t: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType(t)), dtype=np.float32)


def set_d(raw: torch.Tensor, t: int, d: torch.Tensor) -> None:
    """Every block's fp16 d of rows `raw` := the fp16 bit patterns d [rows, blocks] (int32)."""
    blk = raw.view(raw.shape[0], -1, gq.block_bytes(t))
    if t == iq.IQ1_M:       # d's four nibbles are the top nibbles of the four u16 scales
        for k in range(4):
            blk[..., 49 + 2 * k] = (blk[..., 49 + 2 * k] & 0x0F) | (((d >> (4 * k)) & 0xF) << 4).to(torch.uint8)
    else:
        blk[..., 0] = (d & 0xFF).to(torch.uint8)
        blk[..., 1] = (d >> 8).to(torch.uint8)


@pytest.mark.parametrize("t", iq.TYPES, ids=gq.type_name)
def test_dequantize_bit_exact_with_gguf(t):
    gen = torch.Generator().manual_seed(torch.seed() % (2**31))
    raw = gq.random_rows(t, 6, 1024, gen)
    ref = reference(raw, t)
    assert np.isfinite(ref).all()
    ours = gq.dequantize(raw, t, 1024)
    assert ours.dtype == torch.float32 and ours.shape == (6, 1024)
    assert np.array_equal(ours.numpy().view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("t", iq.TYPES, ids=gq.type_name)
def test_extreme_scales_bit_exact(t):
    """d = +-0, the smallest subnormal, the largest finite fp16 (65504), and any finite pattern."""
    gen = torch.Generator().manual_seed(t)
    raw = gq.random_rows(t, 8, 2048, gen)
    nb = 2048 // 256
    d = torch.randint(0, 0x10000, (8, nb), dtype=torch.int32, generator=gen)
    d = torch.where((d & 0x7C00) == 0x7C00, d & 0xFBFF, d)          # no inf / nan
    d[0], d[1], d[2], d[3] = 0x0001, 0x7BFF, 0xFBFF, 0x8000           # subnormal, +-max, -0
    d[4, :4] = torch.tensor([0x0000, 0x0400, 0x03FF, 0x8001])
    set_d(raw, t, d)
    ref = reference(raw, t)
    ours = gq.dequantize(raw, t, 2048).numpy()
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))
    assert np.abs(ref[2]).max() > 1e5                                  # the largest scales reached


@pytest.mark.parametrize("t", iq.TYPES, ids=gq.type_name)
def test_random_rows_are_valid_and_scaled(t):
    gen = torch.Generator().manual_seed(3)
    raw = iq.random_rows(t, 4, 512, gen, scale=0.01)
    assert raw.shape == (4, gq.row_bytes(t, 512))
    v = gq.dequantize(raw, t, 512)
    assert np.array_equal(v.numpy(), reference(raw, t))
    assert 0 < float(v.abs().max()) <= 0.01 * 62 * 31                 # d * largest sub-scale * grid value


def test_sizes_and_names_are_ggufs():
    for t in iq.TYPES:
        q = gguf.GGMLQuantizationType(t)
        assert (gq.block_elems(t), gq.block_bytes(t)) == gguf.GGML_QUANT_SIZES[q]
        assert gq.type_name(t) == q.name


def test_no_quantizer_is_a_clear_error():
    with pytest.raises(NotImplementedError, match="no quantizer for IQ2_XXS"):
        gq.quantize(torch.zeros(1, 256), gq.IQ2_XXS)
    with pytest.raises(ValueError, match="multiple of 256"):
        iq.random_rows(iq.IQ1_S, 1, 32)


def test_shipped_grid_header_is_the_generators():
    """kernels/c/ggml_iq_grids.h is what gen_iq_grids writes from gguf.quants today."""
    assert gen_iq_grids.HEADER.read_text() == gen_iq_grids.render()


def test_header_grids_hold_ggufs_values():
    """Independent of the generator's packing: parse the C arrays back and compare to gguf."""
    import re
    text = gen_iq_grids.HEADER.read_text()
    for name, cls, n8 in (("iq2xxs_grid", "IQ2_XXS", 8), ("iq2s_grid", "IQ2_S", 8),
                          ("iq3s_grid", "IQ3_S", 4), ("iq1s_grid", "IQ1_S", 8)):
        body = re.search(name + r"\[\d+\] = \{(.*?)\};", text, re.S).group(1)
        words = [int(w, 16) for w in re.findall(r"0x[0-9a-f]+", body)]
        got = np.array([[((w >> (8 * j)) & 0xFF) for j in range(n8)] for w in words], dtype=np.uint8).view(np.int8)
        c = getattr(gguf.quants, cls)
        c.init_grid()
        assert np.array_equal(got.astype(np.float32), np.asarray(c.grid).reshape(c.grid_shape)), name
