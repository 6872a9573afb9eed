"""The routed experts on per-256 activations for their k-quant tensors (ft_ggml_k256, see
tests/layers/test_ggml_k256.py), forced on and off on every kernel build this CPU runs, against a
float64 reference that rounds each tensor's input as its type is read."""
from __future__ import annotations

import pytest
import torch
from helpers import q8k_act
from test_cpu_kernels import q8_act, rel_err
from test_ggml_banks import mixed_banks

from freetoken import kernels
from freetoken.experts.execution.cpu import CpuExpertExecutor
from freetoken.experts.formats import dequantize_expert
from freetoken.quant import ggml_quants as gq

ISAS = kernels.variants_here()
K_QUANTS = (gq.Q2_K, gq.Q3_K, gq.Q4_K, gq.Q5_K, gq.Q6_K)


def experts64(banks, x, ids, wts, per256: bool) -> torch.Tensor:
    """float64 silu experts, each weight tensor's input rounded as its type is read: per 256 for
    the k-quants when per256, else per 32."""
    n_e = banks["gate"].shape[0]
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float64)
    quant = [tuple(int(banks[k][e, i]) for k, i in (("gate_up_types", 0), ("gate_up_types", 1), ("down_types", 0)))
             for e in range(n_e)]
    for t in range(ids.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            gu, dn = dequantize_expert(banks, "ggml", e, torch.float64)
            rnd = [q8k_act if per256 and ty in K_QUANTS else q8_act for ty in quant[e]]
            inter = dn.shape[1]
            g, u = gu[:inter] @ rnd[0](x[t]), gu[inter:] @ rnd[1](x[t])
            h = (torch.nn.functional.silu(g) * u).float()
            out[t] += float(wts[t, k]) * (dn @ rnd[2](h))
    return out


@pytest.mark.parametrize("isa", ISAS)
def test_experts_on_per_256_activations(isa):
    """Q4_K_M-like banks (k-quant and legacy types per tensor), 2 threads: h is split by columns
    between them and its per-256 part prepared after (moe.c's step 1b)."""
    gen = torch.Generator().manual_seed(38)
    H, I = 512, 256
    banks, _ = mixed_banks(3, H, I, gen)
    lib = kernels.load(isa)
    ex = CpuExpertExecutor(banks, "ggml", H, I, num_threads=2, isa=isa, gemm_tokens=0)
    try:
        for on in (1, 0):
            assert lib.ft_set_ggml_k256(on) == on
            for T in (1, 3):
                ids = torch.stack([torch.randperm(9, generator=gen)[:4] for _ in range(T)])
                wts = torch.rand(T, 4, generator=gen)
                x = torch.randn(T, H, generator=gen)
                assert rel_err(ex.run(x, ids, wts), experts64(banks, x, ids, wts, bool(on))) < 1e-4, (isa, on, T)
    finally:
        lib.ft_set_ggml_k256(0)
        ex.close()
