"""The roofline probes against independent measurements: the read bandwidth against a torch copy
measured here, each peak multiply-add rate against a real GEMM's rate in that format, and the
model's per-token costs against transformers' own parameter count. No timing is asserted on its
own: only each probe against another measurement of the same machine, taken alongside."""
from __future__ import annotations

import json
import platform
import time

import pytest
import torch

from freetoken import kernels
from freetoken.kernels.gemm import GEMM_MODES, gemm_bf16, modes_here
from freetoken.kernels.pool import CpuPool
from freetoken.kernels.roofline import _best as best_time
from freetoken.kernels.roofline import decode_share, measure_machine, model_costs, prefill_share, report

pytestmark = pytest.mark.skipif(kernels.load() is None, reason="no C compiler")


def _best(fn, reps=5):
    return best_time(fn, reps)      # the probe's own timer: both sides timed alike


def test_read_bandwidth_within_2x_of_a_torch_copy():
    """Rounds alternate (the machine is shared): the probe's best read rate vs torch's best copy
    rate (read + write bytes) in the same rounds."""
    torch.set_num_threads(2)
    a = torch.ones(1 << 25, dtype=torch.int64)          # 256 MiB: far past the caches
    b = torch.empty_like(a)
    probe, copy = 0.0, 0.0
    for _ in range(3):
        probe = max(probe, measure_machine(2, read_bytes=256 << 20, reps=2, probe_s=0.001).read_bw)
        copy = max(copy, 2 * a.nbytes / _best(lambda: b.copy_(a), 2))
    assert copy / 2 <= probe <= 2 * copy, (probe / 1e9, copy / 1e9)


def test_probes_on_the_process_clock():
    """clock=time.process_time (one thread on a loaded machine: the bench's --clock process): the
    read rate within 2x of a torch copy timed on the same clock, every peak measured and positive."""
    torch.set_num_threads(1)
    a = torch.ones(1 << 24, dtype=torch.int64)          # 128 MiB: past the caches
    b = torch.empty_like(a)
    probe, copy = 0.0, 0.0
    for _ in range(3):
        m = measure_machine(1, read_bytes=128 << 20, reps=2, probe_s=0.001, clock=time.process_time)
        probe = max(probe, m.read_bw)
        copy = max(copy, 2 * a.nbytes / best_time(lambda: b.copy_(a), 2, time.process_time))
    assert copy / 2 <= probe <= 2 * copy, (probe / 1e9, copy / 1e9)
    assert "fp32" in m.peak and all(v > 0 for v in m.peak.values())


def test_peaks_at_least_the_measured_gemm_rates():
    """fp32: torch's sgemm; bf16: our tiles in every mode that runs here (AMX counts against the
    AMX peak, vdpbf16ps against its own); each probe's rate must be at least the GEMM's."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(256, 1024, generator=g), torch.randn(1024, 1024, generator=g)
    flops = 2 * 256 * 1024 * 1024
    lib = kernels.load()
    pool = CpuPool(lib, 1)
    wb = w.bfloat16()
    tiles = [(mode, peak) for mode, peak in (("amx", "amx_bf16"), ("vdpbf16ps", "bf16")) if mode in modes_here(lib)]
    peaks, rates = {}, {}
    try:
        # rounds alternate probe and GEMMs, best of each; on a shared machine a short probe can lose
        # its core, so up to 8 rounds, stopping once every peak is at least its GEMM's rate
        for rnd in range(8):
            if rnd >= 3 and all(peaks[k] >= v for k, v in rates.items()):
                break
            m = measure_machine(1, read_bytes=16 << 20, reps=3, probe_s=0.02)
            assert {"fp32"} <= set(m.peak) and all(v > 0 for v in m.peak.values())
            for k, v in m.peak.items():
                peaks[k] = max(peaks.get(k, 0.0), v)
            rates["fp32"] = max(rates.get("fp32", 0.0), flops / _best(lambda: torch.nn.functional.linear(x, w), 3))
            for mode, peak in tiles:
                r = flops / _best(lambda: gemm_bf16(pool, GEMM_MODES[mode], wb, x), 3)
                rates[peak] = max(rates.get(peak, 0.0), r)
    finally:
        pool.close()
    for peak, rate in rates.items():
        assert peaks[peak] >= rate, (peak, peaks[peak] / 1e9, rate / 1e9)


def test_model_costs_count_transformers_parameters(tiny_dir):
    """Per-token FLOPs / 2 = the parameters a token touches in transformers' own model (every
    weight of attention and lm_head, top-k of the experts, the router), attention over keys apart."""
    import transformers
    model_dir = tiny_dir("qwen3_moe")
    cfg = json.loads((model_dir / "config.json").read_text())
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    n = {k: v.numel() for k, v in hf.named_parameters()}
    layers, k, e = cfg["num_hidden_layers"], cfg["num_experts_per_tok"], cfg.get("num_experts") or cfg["num_local_experts"]
    proj = sum(v for name, v in n.items() if any(p in name for p in ("q_proj", "k_proj", "v_proj", "o_proj")))
    experts = sum(v for name, v in n.items() if ".experts." in name)
    router = sum(v for name, v in n.items() if name.endswith("mlp.gate.weight"))
    head = n.get("lm_head.weight", n["model.embed_tokens.weight"])
    phases = model_costs(cfg, context=0)
    by = {p.name.split(" (")[0]: p for p in phases}
    assert by["attention projections"].flops == 2 * proj
    assert by["experts"].flops == 2 * experts * k // e
    assert by["router"].flops == 2 * router
    assert by["lm_head"].flops == 2 * head
    assert by["experts"].bytes == 2 * experts * k // e          # bf16 weights by default
    with_keys = {p.name.split(" (")[0]: p for p in model_costs(cfg, context=100)}["attention"]
    hkv, d = cfg["num_key_value_heads"], cfg["head_dim"]
    assert with_keys.bytes == layers * 2 * hkv * d * 100 * 2     # K and V rows of 100 keys, bf16


def test_shares_and_report():
    from freetoken.kernels.roofline import Machine, Phase
    m = Machine(2, read_bw=10e9, peak={"fp32": 100e9, "amx_bf16": 1000e9, "bf16": 50e9})
    phases = [Phase("a", 1e9, 2e9), Phase("b", 1e9, 0)]
    assert decode_share(phases, m, tok_s=2.5) == pytest.approx(0.5)          # 2 GB/step at 2.5/s of 10 GB/s
    assert prefill_share(phases, m, tok_s=250) == pytest.approx(0.5)         # 2 GFLOP at 250/s of 1000
    assert m.ceiling("bf16") == ("amx_bf16", 1000e9) and m.ceiling("fp32") == ("fp32", 100e9)
    text = report(phases, m)
    assert "decode <= 5.0 tok/s" in text and "prefill <= 500 tok/s (bf16 on amx_bf16)" in text


@pytest.mark.parametrize("variant", ["native", "avx2", "portable"])
def test_peaks_within_the_instructions_rate_per_cycle(variant):
    """Each build's peaks against the instruction count: FLOP per cycle per thread (the clock from
    a chain of dependent imuls) at most the instruction's own rate (CYCLE_FLOPS: a TDPBF16PS is
    1024 FLOP a cycle), the median burst at most the best; fp32 in every build, the others only
    where the build has the instruction (portable: fp32 alone)."""
    from freetoken.kernels.roofline import CYCLE_FLOPS
    if variant not in kernels.variants_here():
        pytest.skip(f"the {variant} build does not run here")
    m = measure_machine(1, read_bytes=16 << 20, reps=1, probe_s=0.005, lib=kernels.load(variant))
    assert "fp32" in m.peak and (variant != "portable" or set(m.peak) == {"fp32"}), m.describe()
    if platform.machine().lower() in ("x86_64", "amd64"):       # the imul chain is x86-64 asm
        assert 0.2e9 < m.hz < 8e9, m.describe()
    for kind, rate in m.peak.items():
        assert 0 < m.median[kind] <= rate, m.describe()
        # 15%: the clock is measured after the bursts, and a turbo step may fall between
        assert m.per_cycle(kind) <= 1.15 * CYCLE_FLOPS[kind], m.describe()


def test_prefill_counts_the_lm_head_once_per_prompt():
    from freetoken.kernels.roofline import Machine, Phase, prefill_flops
    phases = [Phase("experts", 0, 100.0), Phase("lm_head", 0, 40.0)]
    assert prefill_flops(phases) == 140.0 and prefill_flops(phases, prompt=4) == 110.0
    m = Machine(1, read_bw=1.0, peak={"amx_bf16": 1100.0})
    assert prefill_share(phases, m, tok_s=10, prompt=4) == pytest.approx(1.0)


@pytest.mark.parametrize("variant", ["native", "avx2", "portable"])
def test_tile_ceilings_sum_exactly_under_the_instructions_rate(variant):
    """The AMX GEMM's own tile loop with its packed x in L1, L2 and L3 (ft_amx_tile_probe): every
    pass's accumulators hold the exact sum of its 2048 products of bf16 1.0 (tile_ceilings raises
    otherwise), each median at most its best, and no placement above the tile instruction's rate
    per cycle (1024 FLOP, the clock from the imul chain); builds without AMX tiles report none."""
    import ctypes

    from freetoken.kernels.roofline import CYCLE_FLOPS, tile_ceilings
    if variant not in kernels.variants_here():
        pytest.skip(f"the {variant} build does not run here")
    lib = kernels.load(variant)
    got = tile_ceilings(lib, rounds=2, passes=1)
    if "amx" not in modes_here(lib):
        assert got == {}
        return
    pool = CpuPool(lib, 1)
    try:
        hz = (ctypes.c_double * 1)()
        lib.ft_core_hz(pool.handle, 100_000, hz)
    finally:
        pool.close()
    assert set(got) == {"x in L1", "x in L2", "x in L3/memory"}
    for name, (best, median) in got.items():
        assert 0 < median <= best, (name, got)
        if platform.machine().lower() in ("x86_64", "amd64"):
            assert best / hz[0] <= 1.15 * CYCLE_FLOPS["amx_bf16"], (name, best / 1e9, hz[0] / 1e9)
