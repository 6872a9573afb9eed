"""This machine's limits and a model's cost per token against them: the roofline.

`measure_machine()` runs small C probes on the kernel pool's threads: the read bandwidth
(ft_read_bytes over a buffer far larger than the caches, on 2 MiB pages as the weights) and the peak multiply-add rate per
number format (ft_peak_bursts: fp32 FMA, AVX512-BF16 vdpbf16ps, VNNI vpdpbusd, AMX tdpbf16ps /
tdpbssd where the OS grants the tiles). A peak is the sum over the threads of each one's best
burst after a warm-up, timed on that thread's own CPU clock: on a shared machine the wall clock
of a two-thread probe counts the other processes' time (one window read 2.3 TFLOP/s of AMX bf16,
one core's worth, another 8.1), and a virtual machine's AMX unit runs some bursts at ~0.4x
(a neighbour on the host: measured on thread CPU time at the same clock), so the best burst is
the machine's peak and the median says how often it gets it. Each thread's clock (ft_core_hz)
turns a rate into FLOP per cycle, checked against the instruction's own (CYCLE_FLOPS).

`model_costs()` counts, per phase of one layer stack, the bytes a decode step reads and the
multiply-adds a token costs (weights from the config, experts at their bytes in the pool, KV in
bf16). A decode step cannot beat bytes / bandwidth, a prefill token FLOPs / peak: the share
`bound / measured` says how far from the limit an engine runs, on any machine the first time
it runs there (`freetoken check --roofline`, bench/vs_llamacpp.py)."""
from __future__ import annotations

import ctypes
import statistics
import time
from dataclasses import dataclass, field

import torch

from . import cpu_kernels
from .huge_pages import huge_empty
from .pool import CpuPool

PEAK_KINDS = {"fp32": 0, "bf16": 1, "int8": 2, "amx_bf16": 3, "amx_int8": 4}
# the instructions a weight format's prefill GEMM can use (its best one is the ceiling)
FORMAT_PEAKS = {"bf16": ("amx_bf16", "bf16", "fp32"), "int8": ("amx_int8", "int8", "fp32"), "fp32": ("fp32",)}
# the most FLOP (2 per multiply-add) one core can issue per cycle: two 512-bit FMA ports; one
# 16x16x32 TDPBF16PS (16x16x64 TDPBSSD) per 16 cycles; vdpbf16ps / vpdpbusd on two ports
CYCLE_FLOPS = {"fp32": 64, "bf16": 128, "int8": 256, "amx_bf16": 1024, "amx_int8": 2048}


@dataclass
class Machine:
    threads: int
    read_bw: float                              # bytes/s, all threads
    peak: dict[str, float] = field(default_factory=dict)   # FLOP/s (2 per multiply-add) per PEAK_KINDS
    median: dict[str, float] = field(default_factory=dict)  # the same from each thread's median burst
    hz: float = 0.0                             # the threads' mean clock (0: not measured here)

    def per_cycle(self, kind: str) -> float:
        """FLOP per cycle per thread of `kind`'s peak (0 where the clock is unknown)."""
        return self.peak[kind] / self.threads / self.hz if self.hz else 0.0

    def ceiling(self, fmt: str) -> tuple[str, float]:
        """(instruction, FLOP/s): the fastest one a `fmt` GEMM can use here."""
        kinds = [k for k in FORMAT_PEAKS.get(fmt, ("fp32",)) if k in self.peak]
        best = max(kinds, key=lambda k: self.peak[k])
        return best, self.peak[best]

    def describe(self) -> str:
        peaks = ", ".join(f"{k} {v / 1e9:.0f} (median {self.median.get(k, v) / 1e9:.0f}"
                          + (f", {self.per_cycle(k):.0f}/{CYCLE_FLOPS[k]} FLOP/cycle" if self.hz else "") + ")"
                          for k, v in self.peak.items())
        clock = f" at {self.hz / 1e9:.2f} GHz" if self.hz else ""
        return (f"read {self.read_bw / 1e9:.1f} GB/s; peak GFLOP/s {peaks}; "
                f"best burst per thread on its CPU clock, {self.threads} threads{clock}")


def _best(fn, reps: int, clock=time.perf_counter) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t = clock()
        fn()
        best = min(best, clock() - t)
    return best


def _burst_iters(lib, pool: CpuPool, kind: int, burst_s: float, secs) -> int:
    """Rounds of `kind`'s instruction for a burst of about burst_s, from a short first one."""
    iters, n = 256, pool.num_threads
    while True:
        lib.ft_peak_bursts(pool.handle, kind, iters, 1, secs)
        if min(secs[:n]) > burst_s / 2 or iters > 1 << 34:
            return iters
        iters *= 4 if min(secs[:n]) < burst_s / 8 else 2


def _peaks(lib, pool: CpuPool, probe_s: float, bursts: int, passes: int = 2) -> tuple[dict, dict]:
    """Per format: (the threads' best bursts summed, their median bursts summed), in FLOP/s;
    each burst about probe_s / bursts of one thread's CPU time, `passes` passes over the formats
    (a slow spell of the host's AMX unit lasts longer than one format's bursts)."""
    n = pool.num_threads
    secs = (ctypes.c_double * (n * bursts))()
    kinds = {name: k for name, k in PEAK_KINDS.items() if lib.ft_peak_bursts(pool.handle, k, 1, 1, secs) >= 0}
    iters = {name: _burst_iters(lib, pool, k, probe_s / bursts, secs) for name, k in kinds.items()}
    rates = {name: [[] for _ in range(n)] for name in kinds}
    for _ in range(passes):
        for name, k in kinds.items():
            macs = lib.ft_peak_bursts(pool.handle, k, iters[name], bursts, secs)
            for t in range(n):
                rates[name][t] += [2 * macs / max(s, 1e-9) for s in secs[t * bursts:(t + 1) * bursts]]
    peak = {name: sum(max(r) for r in per) for name, per in rates.items()}
    median = {name: sum(statistics.median(r) for r in per) for name, per in rates.items()}
    return peak, median


# where the prefill tiles' packed x sits in ft_amx_tile_probe (A, the weights' sub-panel, in L1)
TILE_PLACES = {"x in L1": 0, "x in L2": 1, "x in L3/memory": 2}


def tile_ceilings(lib=None, rounds: int = 5, passes: int = 64) -> dict[str, tuple[float, float]]:
    """The AMX GEMM's own tile loop (c/gemm_bf16.c, 2 x 2 tiles, per-pair accumulators between
    sub-panels) on the calling thread with its packed x in L1, L2 and L3/memory: (best, median)
    FLOP/s over `rounds` alternating rounds on this thread's CPU clock (the host's AMX slow spells
    last seconds: alternating keeps each placement's best from one window); {} where the tiles do
    not run. Raises if a pass's accumulators are not the exact sum they must hold. lib: a kernel
    build (kernels.load(variant)); the native one by default."""
    lib = lib or cpu_kernels()
    check = ctypes.c_float()
    if lib is None:
        return {}
    if lib.ft_amx_tile_probe(0, 1, ctypes.byref(check)) < 0:
        return {}
    rates: dict[str, list[float]] = {name: [] for name in TILE_PLACES}
    for _ in range(rounds):
        for name, place in TILE_PLACES.items():
            t = time.thread_time()
            macs = lib.ft_amx_tile_probe(place, passes, ctypes.byref(check))
            rates[name].append(2 * macs / max(time.thread_time() - t, 1e-9))
            if check.value != 2048.0:
                raise RuntimeError(f"the tile probe summed {check.value}, not 2048 ({name})")
    return {name: (max(r), statistics.median(r)) for name, r in rates.items()}


def measure_machine(threads: int | None = None, read_bytes: int = 256 << 20, reps: int = 3,
                    probe_s: float = 0.05, clock=time.perf_counter, bursts: int = 9, lib=None) -> Machine:
    """The read bandwidth and the peak rate of every format this CPU runs (about a second).
    clock: time.process_time times the read probe on this process's CPU time, for one thread on
    a machine other programs load (the wall clock counts the time they held the core); the peak
    probes always run on each thread's own CPU clock, `bursts` bursts of ~probe_s / bursts each.
    A peak assumes each pool thread has a core of its own (threads <= cores). lib: a kernel
    build (kernels.load(variant)); the native one by default."""
    lib = lib or cpu_kernels()
    if lib is None:
        raise RuntimeError("the roofline probes need the C kernels (no C compiler found)")
    pool = CpuPool(lib, threads, spin_us=200)
    try:
        # on 2 MiB pages, as the weights are (huge_pages.py): over 4 KiB ones the probe read 0.6x as
        # fast on the Zen 4 of issue 38 (19.7 vs 33.1 GB/s, one thread), below what both engines stream
        buf = huge_empty((read_bytes // 8,), torch.int64).fill_(1)
        bw = buf.nbytes / _best(lambda: lib.ft_read_bytes(pool.handle, buf.data_ptr(), buf.nbytes), reps, clock)
        del buf
        peak, median = _peaks(lib, pool, probe_s, bursts)
        hz = (ctypes.c_double * pool.num_threads)()
        lib.ft_core_hz(pool.handle, 100_000, hz)
        return Machine(pool.num_threads, bw, peak, median, statistics.fmean(hz))
    finally:
        pool.close()


@dataclass
class Phase:
    name: str
    bytes: float        # read per decode step (one sequence)
    flops: float        # per token (2 per multiply-add)


def model_costs(config: dict, *, weight_bytes: float = 2.0, expert_bytes: float | None = None,
                context: int = 512, kv_bytes: float = 2.0) -> list[Phase]:
    """Per-token costs by phase for a decoder from its HF-style config: attention projections,
    attention over `context` keys, router, routed experts (top-k of `expert_bytes` each; default
    3 x hidden x intermediate x weight_bytes), shared experts or a dense MLP, lm_head."""
    g = lambda *names, default=0: next((config[n] for n in names if config.get(n) is not None), default)  # noqa: E731
    H, L = g("hidden_size"), g("num_hidden_layers")
    hq = g("num_attention_heads")
    hkv = g("num_key_value_heads", default=hq)
    d = g("head_dim", default=H // max(1, hq))
    E, k = g("num_experts", "n_routed_experts", "num_local_experts"), g("num_experts_per_tok", "moe_topk", default=0)
    inter = g("moe_intermediate_size", "intermediate_size")
    shared = g("n_shared_experts", default=0) * inter + g("shared_expert_intermediate_size", default=0)
    vocab = g("vocab_size")
    proj = H * (hq + 2 * hkv) * d + hq * d * H
    per_expert = 3 * H * inter
    e_bytes = expert_bytes if expert_bytes is not None else per_expert * weight_bytes
    phases = [Phase("attention projections", L * proj * weight_bytes, 2 * L * proj),
              Phase(f"attention ({context} keys)", L * 2 * hkv * d * context * kv_bytes, 2 * L * 2 * hq * d * context)]
    if E and k:
        phases.append(Phase("router", L * H * E * weight_bytes, 2 * L * H * E))
        phases.append(Phase(f"experts (top-{k} of {E})", L * k * e_bytes, 2 * L * k * per_expert))
        if shared:
            phases.append(Phase("shared experts", L * 3 * H * shared * weight_bytes, 2 * L * 3 * H * shared))
    else:
        mlp = 3 * H * g("intermediate_size")
        phases.append(Phase("MLP", L * mlp * weight_bytes, 2 * L * mlp))
    phases.append(Phase("lm_head", vocab * H * weight_bytes, 2 * vocab * H))
    return phases


def decode_share(phases: list[Phase], machine: Machine, tok_s: float) -> float:
    """Bytes per step / bandwidth over the measured time per step (one sequence)."""
    return sum(p.bytes for p in phases) * tok_s / machine.read_bw


def prefill_flops(phases: list[Phase], prompt: int = 0) -> float:
    """FLOPs per prompt token: a prefill of `prompt` tokens runs the lm_head on its last one only
    (both engines), so that phase counts 1 / prompt per token (0: every token, as a decode step)."""
    return sum(p.flops / prompt if prompt and p.name == "lm_head" else p.flops for p in phases)


def prefill_share(phases: list[Phase], machine: Machine, tok_s: float, fmt: str = "bf16", prompt: int = 0) -> float:
    """FLOPs per token / the format's peak over the measured time per token."""
    return prefill_flops(phases, prompt) * tok_s / machine.ceiling(fmt)[1]


def report(phases: list[Phase], machine: Machine, fmt: str = "bf16") -> str:
    """A table: per phase the decode bound (bytes / bandwidth) and the prefill bound (FLOPs / peak)."""
    inst, peak = machine.ceiling(fmt)
    rows = [f"{'phase':<28} {'MB/step':>9} {'decode ms':>10} {'MFLOP/tok':>10} {'prefill us/tok':>15}"]
    for p in phases + [Phase("total", sum(p.bytes for p in phases), sum(p.flops for p in phases))]:
        rows.append(f"{p.name:<28} {p.bytes / 1e6:>9.1f} {1e3 * p.bytes / machine.read_bw:>10.2f} "
                    f"{p.flops / 1e6:>10.1f} {1e6 * p.flops / peak:>15.1f}")
    total_b, total_f = sum(p.bytes for p in phases), sum(p.flops for p in phases)
    rows.append(f"limits: decode <= {machine.read_bw / total_b:.1f} tok/s (read bandwidth), "
                f"prefill <= {peak / total_f:.0f} tok/s ({fmt} on {inst})")
    return "\n".join(rows)
