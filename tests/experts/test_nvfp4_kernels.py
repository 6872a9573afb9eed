"""NVFP4 experts in the C kernels: dequantization bit-exact with the torch reference
(quant/nvfp4.py) over every e4m3 scale byte, and the fused dot tiles over every loop path
(8-block main loop, block pairs, an unpaired last block) against float64."""
import pytest
import torch

from freetoken.experts.execution.cpu import CpuExpertExecutor
from freetoken.experts.formats import dequantize_expert, quantize_banks
from freetoken.quant.nvfp4 import dequantize_bank, pack_scales

from test_cpu_kernels import ISAS, assert_matches_q8, dense64, reference64, rel_err, routes


def raw_banks(n, hidden, inter, gen):
    """Random codes and every finite e4m3 scale byte (subnormals included), per-row global scales."""
    def bank(rows, cols):
        blocks = torch.randint(0, 256, (n, rows, cols // 16, 8), generator=gen, dtype=torch.uint8)
        scales = torch.randint(0, 127, (n, rows, cols // 16), generator=gen).to(torch.uint8)   # positive, no NaN
        scales[scales == 0x7F] = 0x38
        glob = torch.rand(n, rows, generator=gen) * 1e-2 + 1e-4
        return blocks, pack_scales(scales, glob)
    gu, gus = bank(2 * inter, hidden)
    dn, dns = bank(hidden, inter)
    return {"gate_up_blocks": gu, "gate_up_scales": gus, "down_blocks": dn, "down_scales": dns}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("hidden,inter", [(32, 64), (256, 32), (320, 96), (544, 160)])
def test_dequant_bit_exact_and_tiles_match_float64(isa, hidden, inter):
    gen = torch.Generator().manual_seed(hidden + inter)
    n = 4
    banks = raw_banks(n, hidden, inter, gen)
    ex = CpuExpertExecutor(banks, "nvfp4", hidden, inter, isa=isa, gemm_tokens=0)
    for fid in range(n):
        for got, ref in zip(ex._dequantize(fid), dequantize_expert(banks, "nvfp4", fid)):
            assert torch.equal(got, ref)
    dense = dense64(banks, "nvfp4")
    for t, k in ((1, 1), (2, 3), (4, 2), (7, 4)):
        ids, w = routes(t, k, n, gen)
        x = torch.randn(t, hidden, generator=gen)
        y = ex.run(x, ids, w)
        assert_matches_q8(y, banks, dense, x, ids, w, "silu", note=(t, k))
        assert rel_err(y, reference64(banks, dense, x, ids, w, "silu")) < 6e-2, (t, k)
    ex.close()


def test_requantized_float_banks_round_trip():
    gen = torch.Generator().manual_seed(0)
    gu, dn = torch.randn(3, 64, 96, generator=gen), torch.randn(3, 96, 32, generator=gen)
    banks = quantize_banks(gu, dn, "nvfp4")
    assert banks["gate_up_blocks"].shape == (3, 64, 6, 8) and banks["gate_up_scales"].shape == (3, 64, 6 + 4)
    deq = dequantize_bank(banks["gate_up_blocks"], banks["gate_up_scales"])
    assert (deq.reshape(3, 64, 96) - gu).abs().max() < gu.abs().max() / 5
