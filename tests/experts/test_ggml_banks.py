"""The "ggml" expert format (raw llama.cpp blocks, a type per expert tensor) through the torch
reference path, the pool and the tiered cache: banks mixing types across layers, padded rows."""
from __future__ import annotations

import pytest
import torch

from freetoken.experts.formats import dequantize_expert
from freetoken.experts.ggml_banks import check_ggml_banks, ggml_expert_nbytes, quantize_ggml
from freetoken.experts.memory.pool import ExpertPool, ExpertSpec
from freetoken.experts.execution.torch_exec import run_experts
from freetoken.quant import ggml_quants as gq

# per layer (gate, up, down): Q4_K_M-like mixes, one layer all legacy types
LAYER_TYPES = [(gq.Q4_K, gq.Q4_K, gq.Q6_K), (gq.Q5_K, gq.Q4_K, gq.Q4_K), (gq.Q8_0, gq.Q4_0, gq.MXFP4)]


def pad_rows(rows: torch.Tensor, width: int) -> torch.Tensor:
    """u8 [..., rb] -> [..., width] with zero bytes after the blocks."""
    return torch.nn.functional.pad(rows, (0, width - rows.shape[-1]))


def mixed_banks(E: int, H: int, I: int, gen: torch.Generator, layer_types=LAYER_TYPES):
    """Banks of len(layer_types) layers x E experts, each layer in its own types, each bank's
    rows padded to its widest; also returns the float weights the blocks came from."""
    layers, floats = [], []
    for g, u, d in layer_types:
        gu = torch.randn(E, 2 * I, H, generator=gen) * 0.1
        dn = torch.randn(E, H, I, generator=gen) * 0.1
        layers.append(quantize_ggml(gu, dn, g, u, d))
        floats.append((gu, dn))
    out = {}
    for k in ("gate", "up", "down"):
        width = max(b[k].shape[2] for b in layers)
        out[k] = torch.cat([pad_rows(b[k], width) for b in layers]).contiguous()
    for k in ("gate_up_types", "down_types"):
        out[k] = torch.cat([b[k] for b in layers]).contiguous()
    return out, floats


def test_banks_dequantize_per_expert_type():
    gen = torch.Generator().manual_seed(0)
    E, H, I = 3, 256, 512
    banks, floats = mixed_banks(E, H, I, gen)
    assert check_ggml_banks(banks, H, I) == {gq.Q4_K, gq.Q5_K, gq.Q6_K, gq.Q8_0, gq.Q4_0, gq.MXFP4}
    assert banks["gate"].shape == (3 * E, I, gq.row_bytes(gq.Q8_0, H))   # the widest type
    assert banks["up"].shape == (3 * E, I, gq.row_bytes(gq.Q4_K, H))     # its own: Q4_K and Q4_0 alike
    for layer, (g, u, d) in enumerate(LAYER_TYPES):
        for e in range(E):
            fid = layer * E + e
            gu, dn = dequantize_expert(banks, "ggml", fid)
            want_gu = torch.cat([gq.dequantize(gq.quantize(floats[layer][0][e, :I], g), g, H),
                                 gq.dequantize(gq.quantize(floats[layer][0][e, I:], u), u, H)])
            assert torch.equal(gu, want_gu)
            assert torch.equal(dn, gq.dequantize(gq.quantize(floats[layer][1][e], d), d, I))
            assert (dn - floats[layer][1][e]).abs().max() < 0.1


def test_torch_executor_runs_ggml_banks():
    gen = torch.Generator().manual_seed(1)
    E, H, I = 4, 256, 256
    banks, _ = mixed_banks(E, H, I, gen)
    spec = ExpertSpec(H, I, "ggml")
    x = torch.randn(5, H, generator=gen)
    ids = torch.randint(0, 3 * E, (5, 3), generator=gen)
    w = torch.rand(5, 3, generator=gen)
    got = run_experts(banks, spec, ids, x, w, rounding="none")     # exact activations
    ref = torch.zeros(5, H, dtype=torch.float64)
    for t in range(5):
        for k in range(3):
            gu, dn = (m.double() for m in dequantize_expert(banks, "ggml", int(ids[t, k])))
            h = gu @ x[t].double()
            ref[t] += float(w[t, k]) * (dn @ (torch.nn.functional.silu(h[:I]) * h[I:]))
    assert ((got.double() - ref).abs().max() / ref.abs().max()) < 1e-5


def test_pool_bytes_match_the_plan_arithmetic():
    gen = torch.Generator().manual_seed(2)
    E, H, I = 2, 256, 256
    banks, _ = mixed_banks(E, H, I, gen, LAYER_TYPES[:1])
    pool = ExpertPool(banks, 1, E, ExpertSpec(H, I, "ggml"))
    assert pool.expert_nbytes == ggml_expert_nbytes(H, I, gq.Q4_K, gq.Q4_K, gq.Q6_K)


def test_tiered_cache_copies_ggml_rows():
    from tiered_helpers import reference
    from freetoken.experts.execution.tiered import TieredExperts
    from freetoken.experts.memory.transfer import ThreadCopyEngine
    from freetoken.experts.execution.host_exec import TorchHostExecutor
    gen = torch.Generator().manual_seed(3)
    E, H, I = 4, 256, 256
    banks, _ = mixed_banks(E, H, I, gen)
    pool = ExpertPool(banks, 3, E, ExpertSpec(H, I, "ggml"))
    ref = reference(pool)
    be = TieredExperts(pool, torch.device("cpu"), 3, "hybrid", copy_engine=ThreadCopyEngine(),
                       host_executor=TorchHostExecutor(pool))
    for step in range(3):
        be.begin_step("prefill" if step == 0 else "decode")
        for layer in range(3):
            x = torch.randn(4 if step == 0 else 1, H, generator=gen)
            ids = torch.randint(0, E, (x.shape[0], 2), generator=gen)
            w = torch.rand(x.shape[0], 2, generator=gen)
            torch.testing.assert_close(be.forward(layer, x, ids, w), ref.forward(layer, x, ids, w),
                                       atol=1e-5, rtol=1e-5)
    assert be.stats()["total"]["fills"] > 0
    be.close()


def test_bad_ggml_banks_are_clear_errors():
    gen = torch.Generator().manual_seed(4)
    banks, _ = mixed_banks(2, 256, 256, gen, LAYER_TYPES[:1])
    small = quantize_ggml(torch.randn(2, 192, 96), torch.randn(2, 96, 96), gq.Q8_0)
    small["down_types"][:] = gq.Q4_K
    with pytest.raises(ValueError, match="multiple of 256"):
        check_ggml_banks(small, 96, 96)
    bad = dict(banks, down=banks["down"][:, :, :100])
    with pytest.raises(ValueError, match="down: rows of 100 bytes"):
        check_ggml_banks(bad, 256, 256)
    bad = dict(banks, gate_up_types=banks["gate_up_types"].long())
    with pytest.raises(ValueError, match="gate_up_types"):
        check_ggml_banks(bad, 256, 256)
