"""ggml expert banks on the device path (issue 33, item 4): cache slots hold the packed bytes and
torch dequantizes the gathered slots by the types they carry (experts/ggml_slots.py), on the CPU
here with the same code a GPU runs. References: `gguf.quants.dequantize` (bit for bit), the C
kernels and the per-expert torch executor (to float32 summation order)."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from helpers import exact_experts
from test_tiered_exact import run_and_compare
from tiered_helpers import one_torch_thread  # noqa: F401

from freetoken.experts import ggml_slots
from freetoken.experts.execution.cpu import CpuExpertExecutor
from freetoken.experts.execution.host_exec import make_host_executor
from freetoken.experts.execution.resident import ResidentExperts
from freetoken.experts.execution.tiered import TieredExperts
from freetoken.experts.execution.torch_exec import run_experts, run_slots
from freetoken.experts.grouped_pool import GroupedPool
from freetoken.experts.measure.bandwidth import BandwidthEstimator
from freetoken.experts.memory.pool import ExpertPool, ExpertSpec
from freetoken.experts.memory.transfer import SyncCopyEngine
from freetoken.quant import ggml_iquants as iq
from freetoken.quant import ggml_quants as gq

TYPES = [t for t in gq.NAMES if t not in gq.FLOAT_TYPES]
H = I = 256


def valid_rows(t: int, rows: int, cols: int, g: torch.Generator, extreme: bool = False) -> torch.Tensor:
    """Valid blocks of type t: random bytes with finite scales (extreme: any finite fp16 scale),
    else weights of rms ~ 1/sqrt(cols) (a stable expert)."""
    if extreme:
        return gq.random_rows(t, rows, cols, g)
    if t in iq.TYPES:
        unit = gq.dequantize(iq.random_rows(t, 8, 256, g, scale=1.0), t, 256).pow(2).mean().sqrt().item()
        return iq.random_rows(t, rows, cols, g, scale=1.0 / (unit * cols ** 0.5))
    return gq.quantize(torch.randn(rows, cols, generator=g) / cols ** 0.5, t)


def mixed_banks(trios, g, extreme=False):
    """ggml banks, expert i in types trios[i] = (gate, up, down); the padding past each row's
    blocks is random bytes (a slot keeps what its previous expert left there)."""
    N = len(trios)
    banks = {}
    for half, (name, rows, cols) in enumerate((("gate", I, H), ("up", I, H), ("down", H, I))):
        b = torch.randint(0, 256, (N, rows, max(gq.row_bytes(tr[half], cols) for tr in trios)), dtype=torch.uint8,
                          generator=g)
        for i, tr in enumerate(trios):
            b[i, :, :gq.row_bytes(tr[half], cols)] = valid_rows(tr[half], rows, cols, g, extreme)
        banks[name] = b
    return {**banks, "gate_up_types": torch.tensor([tr[:2] for tr in trios], dtype=torch.int32),
            "down_types": torch.tensor([[tr[2]] for tr in trios], dtype=torch.int32)}


def gguf_rows(rows: torch.Tensor, t: int, cols: int) -> torch.Tensor:
    raw = rows[:, :gq.row_bytes(t, cols)].contiguous().numpy()
    return torch.from_numpy(np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(t)), np.float32))


def every_type_mix():
    n = len(TYPES)
    return [(TYPES[i], TYPES[(i + 5) % n], TYPES[(i + 11) % n]) for i in range(n)]


@pytest.mark.parametrize("extreme", [False, True], ids=["unit", "any-finite-scale"])
def test_gathered_slots_dequantize_bit_exact(extreme):
    """Slots of every type at once (gate, up and down of each expert in different types, random
    bytes past the rows): each gathered expert equals gguf.quants of its own rows, bit for bit."""
    trios = every_type_mix()
    banks = mixed_banks(trios, torch.Generator().manual_seed(1), extreme)
    types = ggml_slots.bank_types(banks)
    slots = torch.tensor([3, 0, len(trios) - 1, 3] + list(range(len(trios))))
    gu = ggml_slots.gather_dequant(banks, slots, "gate_up", H, I, types)
    dn = ggml_slots.gather_dequant(banks, slots, "down", H, I, types)
    for p, s in enumerate(slots.tolist()):
        gt, ut, dt = trios[s]
        assert torch.equal(gu[p, :I], gguf_rows(banks["gate"][s], gt, H)), gq.type_name(gt)
        assert torch.equal(gu[p, I:], gguf_rows(banks["up"][s], ut, H)), gq.type_name(ut)
        assert torch.equal(dn[p], gguf_rows(banks["down"][s], dt, I)), gq.type_name(dt)


def _route(N, T, K, g):
    ids = torch.stack([torch.randperm(N, generator=g)[:K] for _ in range(T)])
    return torch.randn(T, H, generator=g), ids, torch.softmax(torch.randn(T, K, generator=g), -1)


@pytest.mark.parametrize("t", TYPES + ["mix"], ids=[gq.type_name(t) for t in TYPES] + ["mix"])
def test_run_slots_equals_the_c_kernels(t):
    """The fixed-shape slot executor over packed slots vs the per-expert torch executor (exact
    activations: equal to float32 summation order) and vs the C kernels (the types they read;
    both round activations to int8 per 32, so an intermediate a summation-order ulp away from
    a rounding boundary may flip one int8 step, which moves that token's row: measured here,
    one near-tie 1.5e-5 from .5 in Q5_0's; at most 2 of the 19 token rows off by more than 1e-4
    of the scale, none by more than 2e-2)."""
    g = torch.Generator().manual_seed(7)
    trios = every_type_mix() if t == "mix" else [(t, t, t)] * 4
    banks = mixed_banks(trios, g)
    spec = ExpertSpec(H, I, "ggml")
    kernel = None
    if all(x in gq.KERNEL_TYPES for tr in trios for x in tr):
        kernel = CpuExpertExecutor(banks, "ggml", H, I, num_threads=1)
    rows_off = 0
    for T in (1, 2, 5, 11):
        x, ids, w = _route(len(trios), T, 2, g)
        per_choice = torch.zeros(T, 2, H)
        types = ggml_slots.bank_types(banks)
        got = run_slots(banks, spec, ids, x, w, per_choice, rounding="none", types=types).sum(1)
        want = run_experts(banks, spec, ids, x, w, rounding="none")
        scale = want.abs().max().item()
        torch.testing.assert_close(got, want, atol=2e-5 * scale, rtol=0)
        if kernel is not None:
            got = run_slots(banks, spec, ids, x, w, torch.zeros(T, 2, H), types=types).sum(1)
            err = ((got - kernel.run(x, ids, w)).abs() / scale).amax(-1)
            rows_off += int((err > 1e-4).sum())
            assert err.max().item() <= 2e-2, err
    assert rows_off <= 2
    if kernel is not None:
        kernel.close()


def grouped_ggml_pool(L=4, E=6, seed=3):
    """Layers in different types and row widths, gate and up too (a dynamic mix), one pool per
    widths."""
    g = torch.Generator().manual_seed(seed)
    per_layer = [(gq.Q2_K, gq.Q4_K, gq.Q4_K), (iq.IQ2_XXS, gq.Q3_K, gq.Q6_K),
                 (gq.Q4_K, iq.IQ2_XXS, gq.Q3_K), (iq.IQ1_S, gq.Q2_K, iq.IQ3_XXS)][:L]
    spec = ExpertSpec(H, I, "ggml")
    groups, layers = [], []
    for m, trio in enumerate(per_layer):
        banks = mixed_banks([trio] * E, g)
        # exact widths (a file's group): no padding past this layer's own rows
        for half, (name, cols) in enumerate((("gate", H), ("up", H), ("down", I))):
            assert banks[name].shape[-1] == gq.row_bytes(trio[half], cols)
        groups.append(ExpertPool(banks, 1, E, spec))
        layers.append([m])
    return GroupedPool(groups, layers)


@pytest.mark.parametrize("policy", ["offload", "hybrid"])
@pytest.mark.parametrize("slots", [3, 7, 24])
def test_device_decisions_over_a_grouped_ggml_pool(policy, slots):
    """The device decision path (forced on the CPU) over a mix whose layers differ in type and
    row width: fills write each expert's own bytes into the front of its slot's rows, the slots
    run through run_slots, and the answer is the resident one (exact activations: the int8
    rounding would turn summation-order ulps at a near-tie into a flip, see above)."""
    pool = grouped_ggml_pool()
    be = TieredExperts(pool, torch.device("cpu"), slots, policy, cache_policy="lru",
                       host_executor=make_host_executor(pool, prefer_fast=False), copy_engine=SyncCopyEngine(),
                       guard=False, device_decisions=True, estimator=BandwidthEstimator(6e9, 1e10, online=False))
    with exact_experts():
        run_and_compare(be, pool, steps=6, tol=1e-5)
    assert be._devpath is not None               # the device decided (the stats gave the table back)
    be.close()


def test_resident_sync_free_runs_ggml_slots():
    pool = grouped_ggml_pool(L=2)
    fast, ref = ResidentExperts(pool, torch.device("cpu"), sync_free=True), ResidentExperts(pool, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    for layer in range(2):
        x, ids, w = _route(pool.num_experts, 3, 2, g)
        with exact_experts():
            want = ref.forward(layer, x, ids, w)
            got = fast.forward(layer, x, ids, w)
        torch.testing.assert_close(got, want, atol=2e-5 * want.abs().max().item(), rtol=0)


def test_no_host_sync_in_a_ggml_decode_layer():
    """Offload with the decisions on the device over a grouped ggml mix: a decode MoE layer reads
    no device data on the host (the slots' types are read on the device only)."""
    from helpers import CountHostSyncs
    pool = grouped_ggml_pool()
    be = TieredExperts(pool, torch.device("cpu"), 12, "offload", cache_policy="lru",
                       host_executor=make_host_executor(pool, prefer_fast=False), copy_engine=SyncCopyEngine(),
                       guard=False, device_decisions=True, estimator=BandwidthEstimator(1e9, 3e10, online=False))
    g = torch.Generator().manual_seed(0)
    be.begin_step("prefill")
    for layer in range(pool.num_layers):
        be.forward(layer, *_route(pool.num_experts, 4, 2, g))
    for _ in range(3):
        be.begin_step("decode")
        for layer in range(pool.num_layers):
            x, ids, w = _route(pool.num_experts, 2, 2, g)
            with CountHostSyncs() as mode:
                be.forward(layer, x, ids, w)
            assert mode.ops == [], mode.ops
    assert be._devpath is not None and be._devpath.active
    be.close()
