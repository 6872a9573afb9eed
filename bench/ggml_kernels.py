"""B_H of the CPU expert kernels on llama.cpp block types ("ggml" banks), side by side with our
int8 and mxfp4 kernels on the same shapes, in one process (ratios are what to read on a busy
machine).

    .venv/bin/python bench/ggml_kernels.py                          # decode (1 token), all types
    .venv/bin/python bench/ggml_kernels.py --tokens 1,4 --per-core --isa native,avx2
    .venv/bin/python bench/ggml_kernels.py --types Q4_K,Q6_K --formats int8 --seconds 1
    .venv/bin/python bench/ggml_kernels.py --types Q4_K,Q6_K --formats "" --per-core --isa native,native+k256,native,native+k256
    .venv/bin/python bench/ggml_kernels.py --types Q4_K,IQ2_XXS,IQ2_XS,IQ2_S,IQ3_XXS,IQ3_S,IQ1_S,IQ1_M
    .venv/bin/python bench/ggml_kernels.py --prefill --per-core --types Q2_K,Q3_K,IQ2_XXS --tokens 64,128,512

B_H = bytes of expert weights (blocks incl. their scales) of the distinct experts a call touches
/ call time; weights/s = B_H / bytes per weight, the speed of the arithmetic whatever the width.

--prefill: one routed-expert layer (--experts 64, top-8) of a prompt of --tokens tokens, routed
evenly (tokens x 8 / 64 tokens per expert), through the int8 dot tiles ("dots", each weight block
decoded once per 4 tokens) and through the prefill tiles over a bf16 panel decoded once per call
("tiles", kernels/c/ggml_tiles.c), alternating rounds; ms per layer, tiles/dots speedup, and the
share of this machine's peak multiply-add rate (int8 vpdpbusd for the dots, the tiles' bf16).
The call and per-expert thresholds are set to 1 here, so small --tokens show where the tiles win.
--gemv: the dense decode GEMV instead (kernels/c/dense.c over ggml.c's rows, as layers/ggml_linear.py
runs it): one token, rows of each --types at widths --hidden and --inter (a q/k/v/o or a down
projection's rows), 96 MB of copies streamed so they come from DRAM; GB/s and G weights/s per
--isa entry, best of 3 passes, median of --rounds alternating rounds (--per-core: one thread, its
CPU time), with the ratio to the first entry.
--prefill --gguf FILE: end to end instead, the prefill of one --tokens prompt of that GGUF MoE (the
engine's own thresholds) with the tiles and with the dots, alternating (--per-core: one thread,
its CPU time).
"""
from __future__ import annotations

import argparse

import torch
from common import experts_past_cache
from cpu_experts import build_banks

from freetoken.experts.execution.cpu import CpuExpertExecutor
from freetoken.experts.ggml_banks import quantize_ggml
from freetoken.experts.measure.membw import expert_nbytes, measure_expert_bandwidth, read_bandwidth
from freetoken.quant import ggml_iquants as iq
from freetoken.quant import ggml_quants as gq


def ggml_banks(t: int, n: int, hidden: int, inter: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Banks of one type; gate and up are views of one [n, 2I, RB] tensor (one type, one width),
    the layout a baseline library built from before the separate up bank reads as well."""
    g = torch.Generator().manual_seed(seed)
    if t in iq.TYPES:   # the i-quants have no quantizer here: random valid blocks, small d
        gu = iq.random_rows(t, n * 2 * inter, hidden, g, scale=1e-3).reshape(n, 2 * inter, -1)
        return {"gate": gu[:, :inter], "up": gu[:, inter:], "gate_up_types": torch.full((n, 2), t, dtype=torch.int32),
                "down": iq.random_rows(t, n * hidden, inter, g, scale=1e-3).reshape(n, hidden, -1),
                "down_types": torch.full((n, 1), t, dtype=torch.int32)}
    parts = [quantize_ggml(torch.randn(min(4, n - i), 2 * inter, hidden, generator=g) * 0.02,
                           torch.randn(min(4, n - i), hidden, inter, generator=g) * 0.02, t)
             for i in range(0, n, 4)]
    banks = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    gu = torch.cat([banks["gate"], banks["up"]], 1)
    return dict(banks, gate=gu[:, :inter], up=gu[:, inter:])


def build_baseline(rev: str) -> None:
    """The native kernel library compiled from `rev`'s C sources, registered as variant "baseline"."""
    import subprocess
    import tempfile
    from pathlib import Path

    from freetoken import kernels
    src = Path(tempfile.mkdtemp())
    names = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:freetoken/kernels/c"], check=True,
                           capture_output=True, text=True).stdout.split()
    for name in names:
        blob = subprocess.run(["git", "show", f"{rev}:freetoken/kernels/c/{name}"], check=True, capture_output=True)
        (src / name).write_bytes(blob.stdout)
    here, bind = kernels.SOURCE_DIR, kernels._bind
    kernels.SOURCE_DIR, kernels.VARIANTS["baseline"] = src, kernels.VARIANTS["native"]
    # entry points added after `rev` are left unbound in its library (this bench calls only the dots)
    kernels._bind = lambda lib: bind(_Lenient(lib))
    kernels.sources_digest.cache_clear()    # the build key is the digest of SOURCE_DIR's files (cached)
    try:
        kernels.load("baseline")
    finally:
        kernels.SOURCE_DIR, kernels._bind = here, bind
        kernels.sources_digest.cache_clear()    # else this tree's "native" would reuse rev's library


class _Lenient:
    """An older library: its missing symbols bind as no-ops, and the ranked expert call (newer
    than some baselines) runs as its plain call when no rank is given (the executor's default)."""

    def __init__(self, lib):
        self._lib = lib

    def __getattr__(self, name):
        try:
            return getattr(self._lib, name)
        except AttributeError:
            if name == "ft_moe_run_ranked":
                def ranked(*args):     # (pool, desc, x, dtype, T, K, ids, rank, weights, out)
                    assert args[7] is None, "the baseline library has no ranked expert call"
                    return self._lib.ft_moe_run(*args[:7], *args[8:])
                return ranked
            import types
            return types.SimpleNamespace()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default="Q8_0,Q4_0,Q4_1,Q5_0,Q5_1,IQ4_NL,MXFP4,Q2_K,Q3_K,Q4_K,Q5_K,Q6_K,TQ1_0,TQ2_0")
    ap.add_argument("--formats", default="int8,mxfp4", help="our formats to run beside them")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--experts", type=int, default=None,
                    help="experts in the bank (default: twice the last-level cache at 4 bits a weight; --prefill: 32)")
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--tokens", default="1")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--isa", default="native",
                    help="comma list: native, avx2, portable; a +k256 suffix runs the k-quant rows on per-256 "
                         "activations (kernels/c/ggml_act.c), e.g. native,native+k256,native,native+k256")
    ap.add_argument("--per-core", action="store_true", help="one thread, timed by the thread's CPU clock")
    ap.add_argument("--prefill", action="store_true", help="prefill of one layer: dots vs tiles (see above)")
    ap.add_argument("--gemv", action="store_true", help="the dense decode GEMV of rows from DRAM (see above)")
    ap.add_argument("--rounds", type=int, default=3, help="--prefill: alternating rounds (best of)")
    ap.add_argument("--gguf", default=None, help="--prefill: a GGUF MoE's whole prefill instead of one layer")
    ap.add_argument("--baseline", default=None, metavar="GIT_REV",
                    help="also run the native kernels as built from this git revision (isa 'baseline'): before/after")
    a = ap.parse_args()
    if a.experts is None:
        a.experts = 32 if a.prefill else experts_past_cache(a.hidden, a.inter)
    if a.prefill and a.gguf:
        prefill_gguf(a)
        return
    if a.prefill:
        prefill_main(a)
        return
    if a.baseline:
        build_baseline(a.baseline)
        a.isa += "" if "baseline" in a.isa else ",baseline"
    if a.gemv:
        gemv_main(a)
        return
    clock = "thread" if a.per_core else "wall"
    if a.per_core:
        a.threads = 1
    by_name = {v: k for k, v in gq.NAMES.items()}
    rb = read_bandwidth(num_threads=a.threads, clock=clock)
    print(f"read bandwidth: kernel pool {rb / 1e9:.1f} GB/s (threads: {a.threads or 'one per core'}, clock {clock})")
    print(f"shapes: hidden {a.hidden}, intermediate {a.inter}, {a.experts} experts, top-{a.top_k}")
    print(f"{'weights':8s} {'tok':>3s} {'isa':11s} {'B/weight':>8s} {'B_H GB/s':>9s} {'/read':>6s} "
          f"{'Gweights/s':>10s} {'B_H/int8':>8s}")
    cases = [(f, None) for f in a.formats.split(",") if f] + [("ggml", by_name[t]) for t in a.types.split(",") if t]
    ref: dict[tuple[str, int], float] = {}
    for fmt, t in cases:
        banks = build_banks(fmt, a.experts, a.hidden, a.inter) if t is None else ggml_banks(t, a.experts, a.hidden, a.inter)
        name = fmt if t is None else gq.NAMES[t]
        for entry in a.isa.split(","):
            isa, k256 = entry.removesuffix("+k256"), entry.endswith("+k256")
            ex = CpuExpertExecutor(banks, fmt, a.hidden, a.inter, num_threads=a.threads, isa=isa, gemm_tokens=0)
            # the per-256 activations of the k-quant rows, on or off, set in every library that has the switch
            # (a baseline's stayed as the last entry left it: "baseline" after "baseline+k256" ran per 256)
            if isa != "baseline" or k256 or hasattr(ex.lib, "ft_set_ggml_k256"):
                ex.lib.ft_set_ggml_k256(int(k256))
            per_w = expert_nbytes(ex) / (3 * a.hidden * a.inter)
            for tok in [int(v) for v in a.tokens.split(",")]:
                bh = measure_expert_bandwidth(ex, tokens=tok, top_k=a.top_k, seconds=a.seconds, clock=clock)
                if fmt == "int8":
                    ref[(isa, tok)] = bh
                rel = f"{bh / ref[(isa, tok)]:8.2f}" if (isa, tok) in ref else f"{'-':>8s}"
                shown = ex.isa + ("+k256" if k256 else "")
                print(f"{name:8s} {tok:3d} {shown:11s} {per_w:8.3f} {bh / 1e9:9.1f} {bh / rb:6.2f} "
                      f"{bh / per_w / 1e9:10.2f} {rel}", flush=True)
            ex.close()
        del banks


def gemv_main(a) -> None:
    """--gemv: one-token GEMVs over rows of each type and width, the --isa entries alternating."""
    import ctypes
    import statistics
    import time

    from freetoken import kernels
    from freetoken.kernels.ggml_k256 import _Seg, _tame
    from freetoken.kernels.pool import CpuPool
    threads = 1 if a.per_core else a.threads
    now = time.thread_time if a.per_core else time.perf_counter
    entries = a.isa.split(",")
    libs = {}
    for isa in dict.fromkeys(e.removesuffix("+k256") for e in entries):
        lib = kernels.load(isa)
        libs[isa] = (lib, CpuPool(lib, threads, spin_us=200, small_job_bytes=0))
    print(f"one-token GEMV of rows from DRAM, {threads or 'all'} thread(s), clock {'thread' if a.per_core else 'wall'}; "
          f"median of {a.rounds} alternating rounds")
    by_name = {v: k for k, v in gq.NAMES.items()}
    g = torch.Generator().manual_seed(0)
    for name in a.types.split(","):
        t = by_name[name]
        for K in (a.hidden, a.inter):
            rows = 4096
            mats = [_tame(gq.random_rows(t, rows, K, g), t) for _ in range((96 << 20) // (rows * gq.row_bytes(t, K)) + 1)]
            segs = [_Seg(w.data_ptr(), w.stride(0), t, rows) for w in mats]
            nbytes = len(mats) * rows * gq.row_bytes(t, K)
            x, y = torch.randn(1, K, generator=g), torch.empty(1, rows)
            rates: dict[str, list[float]] = {e: [] for e in entries}
            for _ in range(a.rounds):
                for e in entries:
                    lib, pool = libs[e.removesuffix("+k256")]
                    if hasattr(lib, "ft_set_ggml_k256"):
                        lib.ft_set_ggml_k256(int(e.endswith("+k256")))
                    best = float("inf")
                    for _ in range(3):
                        t0 = now()
                        for s in segs:
                            lib.ft_ggml_linear_run(pool.handle, ctypes.byref(s), 1, K, x.data_ptr(), 0, 1, None,
                                                   y.data_ptr(), rows)
                        best = min(best, now() - t0)
                    rates[e].append(nbytes / best)
            first = statistics.median(rates[entries[0]])
            for e in dict.fromkeys(entries):
                med = statistics.median(rates[e])
                print(f"{name:6s} K {K:5d} {e:18s} {med / 1e9:6.1f} GB/s {med / 1e9 / (gq.row_bytes(t, K) / K):7.2f} "
                      f"Gweights/s {med / first:6.2f}x", flush=True)
    for lib, pool in libs.values():
        pool.close()


def timing_banks(t: int, n: int, hidden: int, inter: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random valid blocks with every fp16 scale 2^-10 (MXFP4's e8m0 2^-8): values of a usable
    size, generated in moments where quantizing 64 experts takes minutes."""
    if t in iq.TYPES:
        return ggml_banks(t, n, hidden, inter, seed)
    g = torch.Generator().manual_seed(seed)

    def rows(r, cols):
        raw = gq.random_rows(t, n * r, cols, g)
        blk = raw.view(n * r, -1, gq.block_bytes(t))
        for off in gq.f16_scale_offsets(t):
            blk[..., off], blk[..., off + 1] = 0x00, 0x14
        if t == gq.MXFP4:
            blk[..., 0] = 120
        return raw.reshape(n, r, -1)
    return {"gate_up": rows(2 * inter, hidden), "gate_up_types": torch.full((n, 2), t, dtype=torch.int32),
            "down": rows(hidden, inter), "down_types": torch.full((n, 1), t, dtype=torch.int32)}


def prefill_main(a) -> None:
    from freetoken.experts.measure.membw import CLOCKS
    from freetoken.kernels.gemm import GEMM_MODES, modes_here
    from freetoken.kernels.roofline import measure_machine
    from freetoken.platform import cpu_model
    threads = 1 if a.per_core else a.threads
    now = CLOCKS["thread" if a.per_core else "wall"]
    m = measure_machine(threads)
    print(f"{cpu_model()}; {m.describe()}")
    print(f"clock: {'thread CPU time (one thread)' if a.per_core else 'wall'}; layer: {a.experts} experts, top-{a.top_k}, hidden {a.hidden}, intermediate {a.inter}; "
          f"best of {a.rounds} alternating rounds")
    by_name = {v: k for k, v in gq.NAMES.items()}
    print(f"{'type':8s} {'tok':>4s} {'tok/exp':>7s} {'isa':16s} {'tiles':9s} {'dots ms':>8s} {'tiles ms':>8s} "
          f"{'speedup':>7s} {'dots %int8':>10s} {'tiles %peak':>11s}")
    for name in a.types.split(","):
        banks = timing_banks(by_name[name], a.experts, a.hidden, a.inter)
        for isa in a.isa.split(","):
            ex = CpuExpertExecutor(banks, "ggml", a.hidden, a.inter, num_threads=threads, isa=isa, gemm_tokens=0)
            lib = ex.lib
            mode = next((md for md in ("amx", "vdpbf16ps", "plain") if md in modes_here(lib)), None)
            peak = m.peak.get({"amx": "amx_bf16", "vdpbf16ps": "bf16"}.get(mode, "fp32"), float("nan"))
            for tok in [int(v) for v in a.tokens.split(",")]:
                g = torch.Generator().manual_seed(tok)
                x = torch.randn(tok, a.hidden, generator=g)
                ids = (torch.arange(tok)[:, None] * a.top_k + torch.arange(a.top_k)) % a.experts
                w = torch.rand(tok, a.top_k, generator=g)
                best = {"dots": float("inf"), "tiles": float("inf")}
                lib.ft_set_gemm(0, 1, 0)
                for _ in range(a.rounds):
                    for path, code in (("dots", 0), ("tiles", GEMM_MODES[mode])):
                        lib.ft_set_ggml_tiles(code, 1)
                        ex.run(x, ids, w)
                        t0 = now()
                        ex.run(x, ids, w)
                        best[path] = min(best[path], now() - t0)
                lib.ft_set_ggml_tiles(0, 16)
                lib.ft_set_gemm(0, 16, 0)
                flops = 2 * tok * a.top_k * 3 * a.hidden * a.inter
                print(f"{name:8s} {tok:4d} {tok * a.top_k / a.experts:7.1f} {ex.isa:16s} {mode:9s} "
                      f"{best['dots'] * 1e3:8.1f} {best['tiles'] * 1e3:8.1f} {best['dots'] / best['tiles']:7.2f} "
                      f"{100 * flops / best['dots'] / m.peak.get('int8', float('nan')):10.1f} "
                      f"{100 * flops / best['tiles'] / peak:11.1f}", flush=True)
            ex.close()
        del banks


def prefill_gguf(a) -> None:
    """Prefill of one prompt of a GGUF MoE through the ggml experts' tiles vs the dots, alternating
    (both engines share the kernel library; its switch is set before each run)."""
    from freetoken import LLM, SamplingParams
    from freetoken.experts.measure.membw import CLOCKS
    from freetoken.kernels import cpu_kernels
    from freetoken.kernels.gemm import GEMM_MODES, GGML_GROUP_MIN, modes_here
    now = CLOCKS["thread" if a.per_core else "wall"]
    prompt = torch.randint(100, 5000, (int(a.tokens),), generator=torch.Generator().manual_seed(0)).tolist()
    threads = 1 if a.per_core else a.threads
    llm = LLM(a.gguf, num_threads=threads, max_model_len=len(prompt) + 64, prefix_cache=False)
    lib = cpu_kernels()
    mode = next(m for m in ("amx", "vdpbf16ps", "plain") if m in modes_here(lib))
    best = {}
    for _ in range(a.rounds):
        for path, code in (("dots", 0), ("tiles", GEMM_MODES[mode])):
            lib.ft_set_ggml_tiles(code, GGML_GROUP_MIN)
            t0 = now()
            llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0))
            best[path] = min(best.get(path, float("inf")), now() - t0)
    llm.close()
    print(f"{a.gguf}: {len(prompt)}-token prefill, {threads or 'all'} thread(s), clock "
          f"{'thread' if a.per_core else 'wall'}: dots {len(prompt) / best['dots']:.0f} tok/s, tiles ({mode}) "
          f"{len(prompt) / best['tiles']:.0f} tok/s: {best['dots'] / best['tiles']:.2f}x")


if __name__ == "__main__":
    main()
