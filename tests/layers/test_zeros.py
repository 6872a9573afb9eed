"""Lazily zeroed host tensors read as zeros, take writes, and match torch.zeros in every way
the KV cache uses them."""
from __future__ import annotations

import pytest
import torch

from freetoken.layers.zeros import LAZY_MIN_BYTES, zeros


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.uint8])
def test_lazy_zeros_equal_torch_zeros(dtype):
    shape = (LAZY_MIN_BYTES // 64 + 3, 4, 16)
    t = zeros(shape, dtype, "cpu")
    assert t.shape == shape and t.dtype == dtype and t.is_contiguous()
    assert torch.equal(t, torch.zeros(shape, dtype=dtype))
    slots = torch.tensor([0, 7, shape[0] - 1])
    t.index_copy_(0, slots, torch.ones(3, 4, 16, dtype=dtype))
    assert t.sum().item() == 3 * 4 * 16
    assert torch.equal(t.index_select(0, torch.tensor([1, 6])), torch.zeros(2, 4, 16, dtype=dtype))


def test_small_tensors_are_plain_zeros():
    t = zeros((2, 3), torch.float32, "cpu")
    assert torch.equal(t, torch.zeros(2, 3)) and t.nbytes < LAZY_MIN_BYTES
