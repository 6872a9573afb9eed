"""The decode GEMV over bf16 weights: the dot tiles vs the AMX tiles, side by side (outside CI).

    PYTHONPATH=. .venv/bin/python bench/amx_gemv.py [--rows 1,2,4,8,16,32,65] [--rounds 3]

Per weight shape (N x K bf16, 2048x2048 and 6144x2048; copies rotated past --rotate-mib so each
call streams its weight from DRAM, not from the last-level cache) and rows M of x, ms per call of
  dots fp32   the dot tiles with fp32 activations (bf16 widened + FMA; bf16_dot off)
  dots bf16   the dot tiles with vdpbf16ps (bf16_dot on; where the build has it)
  amx         kernels/c/amx_gemv.c (ft_set_gemv_amx; where the OS grants AMX)
on one thread (the thread's CPU time: a core's own rate) and on --threads (wall time), the
alternating rounds' best, and the weight GB/s of each and amx's speed over dots fp32.

--step K,K,...: the verify cost curve of the GEMVs alone, on one thread's CPU time (steady under a
shared machine's load; --step-threads N: N threads, wall time): every dense GEMV of a decode step
of bench/speculative.py's medium dense Qwen3 (4 layers of qkv 5120x2048, o 2048x4096, gate+up
12288x2048, down 2048x6144, and the 8192x2048 lm_head; 486 MB, past the LLC) at k + 1 rows, as a
multiple of the 1-row step; --baseline REV: that revision's dot tiles alternating with this tree's.

    PYTHONPATH=. .venv/bin/python bench/amx_gemv.py --step 0,1,4,8,15 [--step-threads 2] [--baseline e0585fc]"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from freetoken.kernels import load  # noqa: E402
from freetoken.kernels.pool import CpuPool  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from decode_attention import build_revision  # noqa: E402

MODES = {"dots fp32": (0, 0), "dots bf16": (1, 0), "amx": (0, 1)}   # (bf16_dot, gemv_amx)


def modes_here(lib) -> list[str]:
    out = ["dots fp32"]
    if lib.ft_set_bf16_dot(1) == 2:
        out.append("dots bf16")
    lib.ft_set_bf16_dot(0)
    if lib.ft_set_gemv_amx(1):
        out.append("amx")
    lib.ft_set_gemv_amx(0)
    return out


def seconds(lib, pool, ws, x, y, clock) -> float:
    """Seconds per call over one pass of the rotated weights (after a warm pass)."""
    n, k = ws[0].shape

    def one_pass():
        for w in ws:
            lib.ft_linear_run(pool.handle, 1, w.data_ptr(), 2 * k, None, 0, n, k, x.data_ptr(), 0, x.shape[0],
                              None, y.data_ptr())
    one_pass()
    t = clock()
    one_pass()
    return (clock() - t) / len(ws)


def table(lib, pools, shape, rows, rounds, rotate_mib):
    n, k = shape
    w0 = torch.randn(n, k).bfloat16()
    ws = [w0] + [w0.clone() for _ in range(max(1, (rotate_mib << 20) // w0.nbytes) - 1)]
    modes = modes_here(lib)
    print(f"\n{n}x{k} bf16 ({w0.nbytes / 2**20:.0f} MiB x {len(ws)} copies); ms per call, "
          f"best of {rounds} alternating rounds (GB/s of weights)")
    print(f"{'M':>3} {'threads':>12} " + " ".join(f"{m:>16}" for m in modes) + f" {'amx/dots fp32':>14}")
    for m in rows:
        x, y = torch.randn(m, k), torch.empty(m, n)
        for label, pool, clock in pools:
            best = {}
            for _ in range(rounds):
                for mode in modes:
                    dot, amx = MODES[mode]
                    lib.ft_set_bf16_dot(dot)
                    lib.ft_set_gemv_amx(amx)
                    best[mode] = min(best.get(mode, 1e9), seconds(lib, pool, ws, x, y, clock))
            lib.ft_set_bf16_dot(0)
            lib.ft_set_gemv_amx(0)
            cells = " ".join(f"{best[md] * 1e3:8.3f} ({w0.nbytes / best[md] / 1e9:5.1f})" for md in modes)
            ratio = f"{best['dots fp32'] / best['amx']:13.2f}x" if "amx" in best else ""
            print(f"{m:>3} {label:>12} {cells} {ratio}")


DENSE_STEP = [(5120, 2048), (2048, 4096), (12288, 2048), (2048, 6144)] * 4 + [(8192, 2048)]


def step_curve(runs, drafts, rounds, clock):
    """Seconds of one decode step's GEMVs of the medium dense model at k + 1 rows, per run
    (label, lib, pool, mode), the runs alternating in each round (their order reversed every other
    round); medians of the rounds."""
    ws = [torch.randn(n, k).bfloat16() for n, k in DENSE_STEP]
    labels = [r[0] for r in runs]
    print(f"\nverify cost of the medium dense Qwen3's GEMVs ({sum(w.nbytes for w in ws) / 2**20:.0f} MiB bf16), "
          f"ms per step ({'one thread' if clock is time.thread_time else 'wall'}), medians of {rounds} alternating "
          f"rounds; cost / the run's own 1-row step")
    print(f"{'k':>3} " + " ".join(f"{m:>24}" for m in labels))
    plain = {}
    for d in drafts:
        xs = {k: torch.randn(d + 1, k) for k in {k for _, k in DENSE_STEP}}
        ys = {n: torch.empty(d + 1, n) for n in {n for n, _ in DENSE_STEP}}
        times = {m: [] for m in labels}
        for r in range(rounds):
            for label, lib, pool, mode in runs[:: 1 if r % 2 == 0 else -1]:
                lib.ft_set_bf16_dot(MODES[mode][0])
                lib.ft_set_gemv_amx(MODES[mode][1])
                t = clock()
                for w in ws:
                    n, k = w.shape
                    lib.ft_linear_run(pool.handle, 1, w.data_ptr(), 2 * k, None, 0, n, k, xs[k].data_ptr(), 0, d + 1,
                                      None, ys[n].data_ptr())
                times[label].append(clock() - t)
                lib.ft_set_bf16_dot(0)
                lib.ft_set_gemv_amx(0)
        best = {m: statistics.median(t) for m, t in times.items()}
        plain = plain or dict(best)
        print(f"{d:>3} " + " ".join(f"{best[m] * 1e3:12.2f} ({best[m] / plain[m]:5.2f}x)   " for m in labels),
              flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,2,4,8,16,32,65")
    ap.add_argument("--shapes", default="2048x2048,6144x2048", help="N x K of the bf16 weights")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rotate-mib", type=int, default=640, help="weight copies rotated (past the LLC)")
    ap.add_argument("--step", default=None, metavar="K,K,...", help="the verify cost curve at these draft counts "
                    "(e.g. 0,1,2,4,8,16) instead of the per-shape tables")
    ap.add_argument("--step-threads", type=int, default=1, help="--step: threads (1: the thread's CPU time, "
                    "more: wall time)")
    ap.add_argument("--baseline", default=None, metavar="GIT_REV", help="--step: also the dot tiles of this "
                    "revision's kernels, alternating with this tree's")
    args = ap.parse_args()
    lib = load()
    if lib is None:
        sys.exit("amx_gemv: the C kernels do not build here")
    one, many = CpuPool(lib, 1), CpuPool(lib, args.threads)
    pools = [("1 (cpu time)", one, time.thread_time), (f"{args.threads} (wall)", many, time.perf_counter)]
    try:
        if args.step:
            pool = one if args.step_threads == 1 else CpuPool(lib, args.step_threads)
            runs = [(m, lib, pool, m) for m in modes_here(lib)]
            if args.baseline:
                old = build_revision(args.baseline)
                old_pool = CpuPool(old, args.step_threads)
                runs += [(f"{args.baseline[:7]} {m}", old, old_pool, m) for m in modes_here(old) if m != "amx"]
            step_curve(runs, [int(d) for d in args.step.split(",")], args.rounds,
                       time.thread_time if args.step_threads == 1 else time.perf_counter)
            return
        for s in args.shapes.split(","):
            n, k = map(int, s.split("x"))
            table(lib, pools, (n, k), [int(r) for r in args.rows.split(",")], args.rounds, args.rotate_mib)
    finally:
        one.close()
        many.close()


if __name__ == "__main__":
    main()
