"""Decode attention over a bf16 paged KV cache: the C kernel of this tree vs the one of an
earlier revision (built from `git archive` of its kernels; `--baseline none` skips it), side by
side in alternating rounds, with the KV bytes' rate next to the machine's read bandwidth and copy
bandwidth, both re-measured in every round between the kernel's timings (on a shared machine
they drift with the load: each case is judged against the bandwidth of its own rounds).

    .venv/bin/python bench/decode_attention.py [--threads 2] [--contexts 4096,16384,65536]
                                               [--seqs 1,4] [--baseline 154d695|none]

Shapes of the medium Qwen3-MoE (32 query heads, 4 KV heads, head_dim 128), one layer; keys on
16-slot blocks in random order as the paged cache lays them out."""
from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import torch

from freetoken import kernels
from freetoken.experts.measure.membw import read_bandwidth
from freetoken.kernels.pool import CpuPool
from freetoken.layers.attention.paged import attend_rows

ROOT = Path(__file__).resolve().parent.parent


def build_revision(rev: str) -> ctypes.CDLL:
    """The kernel library of git revision `rev` (its kernels/c/ or older single cpu_kernels.c)."""
    tmp = Path(tempfile.mkdtemp(prefix="ft-kernels-"))
    tar = subprocess.run(["git", "archive", rev, "freetoken/kernels"], cwd=ROOT, capture_output=True, check=True)
    (tmp / "k.tar").write_bytes(tar.stdout)
    with tarfile.open(tmp / "k.tar") as t:
        t.extractall(tmp, filter="data")
    srcs = sorted((tmp / "freetoken/kernels/c").glob("*.c")) or [tmp / "freetoken/kernels/cpu_kernels.c"]
    out = tmp / "lib.so"
    subprocess.run([kernels._compiler(), *kernels._BASE_FLAGS, "-march=native", *map(str, srcs), "-o", str(out), "-lm"],
                   check=True)
    return kernels._bind(ctypes.CDLL(str(out)))


def copy_bandwidth(threads: int, clock: str, nbytes: int = 1 << 28) -> float:
    """Best-of-3 torch copy rate, bytes read + written per second (STREAM's "copy" convention)."""
    torch.set_num_threads(threads)
    src, dst = torch.ones(nbytes // 8, dtype=torch.int64), torch.empty(nbytes // 8, dtype=torch.int64)
    dst.copy_(src)
    best, now = float("inf"), CLOCK[clock]
    for _ in range(3):
        t = now()
        dst.copy_(src)
        best = min(best, now() - t)
    return 2 * nbytes / best


def case(ctx: int, seqs: int, hq=32, hkv=4, d=128, block=16, seed=0, sizes_only=False):
    if sizes_only:
        return seqs * ctx * hkv * d * 2 * 2
    g = torch.Generator().manual_seed(ctx + seqs + 1000 * seed)
    blocks_per_seq = -(-ctx // block)
    rows = (blocks_per_seq * seqs + 1) * block
    k = torch.randn(rows, hkv, d, generator=g).bfloat16()
    v = torch.randn(rows, hkv, d, generator=g).bfloat16()
    order = torch.randperm(blocks_per_seq * seqs, generator=g) + 1
    slots = (order.view(seqs, blocks_per_seq, 1) * block + torch.arange(block)).reshape(seqs, -1)[:, :ctx].contiguous()
    q = torch.randn(seqs, hq, d, generator=g)
    lens = torch.full((seqs,), ctx, dtype=torch.int64)
    return q, k, v, slots, lens, seqs * ctx * hkv * d * 2 * 2


CLOCK = {"wall": time.perf_counter, "process": time.process_time}


def timed(pool, cases, reps, clock):
    """Best time per call over `reps` passes, each pass through all `cases` (copies of the KV
    cache whose total outgrows the last-level cache, as the layers of a decode step do)."""
    now = CLOCK[clock]
    for a in cases:
        attend_rows(pool, *a)
    ts = []
    for _ in range(reps):
        t = now()
        for a in cases:
            attend_rows(pool, *a)
        ts.append((now() - t) / len(cases))
    return min(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--contexts", default="4096,16384,65536")
    ap.add_argument("--seqs", default="1,4")
    ap.add_argument("--baseline", default="154d695", help="git revision whose kernel runs beside this tree's, or none")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clock", choices=CLOCK, default="wall",
                    help="process: CPU time of this process, for --threads 1 on a shared machine (a dedicated core)")
    args = ap.parse_args()
    clock_bw = {"wall": "wall", "process": "thread"}[args.clock]
    new = CpuPool(kernels.load(), args.threads)
    old = None if args.baseline == "none" else CpuPool(build_revision(args.baseline), args.threads)
    print(f"kernels {kernels.load().ft_isa().decode()}, {args.threads} threads; per case, medians over {args.rounds} "
          f"rounds of: the kernel, read bandwidth (ft_read_bytes), copy bandwidth (torch, read + write bytes)"
          + ("" if old is None else f"; baseline = {args.baseline}"))
    print(f"{'context':>8}{'seqs':>5}{'KV MB':>8}{'new ms':>9}{'new GB/s':>10}{'read GB/s':>10}{'copy GB/s':>10}"
          f"{'% of read':>10}{'% of copy':>10}" + ("" if old is None else f"{'old ms':>9}{'speed-up':>10}"))
    for ctx in map(int, args.contexts.split(",")):
        for seqs in map(int, args.seqs.split(",")):
            copies = max(1, -(-(256 << 20) // case(ctx, seqs, sizes_only=True)))
            cases = []
            for i in range(copies):
                q, k, v, slots, lens, nbytes = case(ctx, seqs, seed=i)
                cases.append((q, k, v, slots, lens, 128 ** -0.5))
            reps = 3
            t_new, t_old, rd, cp = [], [], [], []
            for r in range(args.rounds):
                kernels_ = ((new, t_new),) if old is None else ((new, t_new), (old, t_old))
                for which in kernels_[:: 1 if r % 2 == 0 else -1]:
                    which[1].append(timed(which[0], cases, reps, args.clock))
                rd.append(read_bandwidth(1 << 28, repeats=3, num_threads=args.threads, clock=clock_bw))
                cp.append(copy_bandwidth(args.threads, args.clock))
            tn, bw_r, bw_c = statistics.median(t_new), statistics.median(rd), statistics.median(cp)
            line = (f"{ctx:8}{seqs:5}{nbytes / 1e6:8.1f}{tn * 1e3:9.3f}{nbytes / tn / 1e9:10.1f}{bw_r / 1e9:10.1f}"
                    f"{bw_c / 1e9:10.1f}{nbytes / tn / bw_r:10.0%}{nbytes / tn / bw_c:10.0%}")
            if old is not None:
                to = statistics.median(t_old)
                line += f"{to * 1e3:9.3f}{to / tn:9.2f}x"
            print(line, flush=True)


if __name__ == "__main__":
    main()
