"""The roofline helpers run and report consistent fields (no timing is asserted)."""
from __future__ import annotations

import torch

from freetoken.experts.execution.cpu import CpuExpertExecutor
from freetoken.experts.formats import quantize_banks
from freetoken.experts.measure.membw import expert_nbytes, measure_expert_bandwidth, read_bandwidth, roofline, torch_read_bandwidth


def test_roofline_fields():
    banks = quantize_banks(torch.randn(4, 64, 64), torch.randn(4, 64, 32), "int8")
    ex = CpuExpertExecutor(banks, "int8", 64, 32)
    assert expert_nbytes(ex) == 64 * 64 + 64 * 2 * 2 + 64 * 32 + 64 * 1 * 2
    assert read_bandwidth(1 << 20, repeats=1) > 0
    assert torch_read_bandwidth(torch.ones(1 << 17, dtype=torch.int64), repeats=1) > 0
    assert measure_expert_bandwidth(ex, tokens=2, top_k=3, seconds=0.0, min_iters=2) > 0
    r = roofline(ex, seconds=0.0, read_bytes=1 << 20)
    assert set(r) >= {"read_bw", "b_h", "ratio", "fmt", "isa", "threads"}
    assert r["fmt"] == "int8" and abs(r["ratio"] - r["b_h"] / r["read_bw"]) < 1e-9
