"""NVFP4 dequantization against transformers' own NVFP4 expert dequantizer (an independent torch
implementation of the same format), and quantization properties."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.core_model_loading import Inkling2LoopDequantizeExperts

from freetoken.quant.nvfp4 import dequantize_nvfp4, from_checkpoint, quantize_nvfp4


def random_nvfp4(experts, rows, cols, seed):
    """Random packed codes, every finite e4m3 scale byte, one global scale per expert."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (experts, rows, cols // 2), generator=g, dtype=torch.uint8)
    scales = torch.randint(0, 255, (experts, rows, cols // 16), generator=g).to(torch.uint8)
    scales[(scales & 0x7F) == 0x7F] = 0x38            # e4m3 NaN bytes -> 1.0
    glob = torch.rand(experts, generator=g) * 1e-3 + 1e-5
    return codes, scales, glob


class _Param:
    def get_parameter(self, name):
        return torch.empty(0, dtype=torch.float32)


@pytest.mark.parametrize("experts,rows,cols", [(3, 5, 32), (2, 7, 64), (1, 1, 16)])
def test_bit_exact_with_transformers_dequantizer(experts, rows, cols):
    codes, scales, glob = random_nvfp4(experts, rows, cols, seed=rows * cols)
    ref = Inkling2LoopDequantizeExperts().convert(
        {"w": codes, "s": scales.view(torch.float8_e4m3fn), "a": glob, "d": torch.ones(experts)},
        ["w", "s", "a", "d"], ["out"], model=_Param(), full_layer_name="x")["out"]
    ours = dequantize_nvfp4(codes.reshape(experts, rows, cols // 16, 8), scales, glob[:, None].expand(experts, rows))
    assert ours.dtype == torch.float32 and torch.equal(ours, ref)


def test_checkpoint_layout_and_per_row_global_scale():
    codes, scales, glob = random_nvfp4(1, 6, 48, seed=1)
    blocks, s, gl = from_checkpoint(codes[0], scales[0].view(torch.float8_e4m3fn), glob[:1].reshape(()))
    assert blocks.shape == (6, 3, 8) and s.dtype == torch.uint8 and gl.shape == (6,)
    full = dequantize_nvfp4(blocks, s, gl)
    # two matrices with different global scales fused row-wise dequantize as each one alone
    other = dequantize_nvfp4(blocks, s, gl * 3)
    fused = dequantize_nvfp4(torch.cat([blocks, blocks]), torch.cat([s, s]), torch.cat([gl, gl * 3]))
    assert torch.equal(fused, torch.cat([full, other]))
    with pytest.raises(ValueError, match="ModelOpt layout"):
        from_checkpoint(codes[0], scales[0, :, :2], glob[:1])


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.floats(1e-3, 1e3), st.integers(0, 2**31 - 1))
def test_quantize_is_near_and_idempotent(rows, groups, mag, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(2, rows, groups * 16, generator=g) * mag
    blocks, scales, glob = quantize_nvfp4(w)
    assert glob.shape == (2, rows)
    deq = dequantize_nvfp4(blocks, scales, glob)
    # per block, the error is at most half the widest e2m1 gap (2 of 6) times the block step, plus e4m3 rounding
    amax = w.reshape(2, rows, groups, 16).abs().amax(-1, keepdim=True)
    err = (deq - w).reshape(2, rows, groups, 16).abs()
    assert (err <= amax * (1 / 6) * 1.07 + 1e-30).all()
    # re-quantizing dequantized values with the same global scale changes nothing
    again = dequantize_nvfp4(*quantize_nvfp4(deq, glob)[:2], glob)
    assert torch.equal(again, deq)
