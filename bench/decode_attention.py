"""Decode attention over a bf16 paged KV cache: the C kernel of this tree vs the one of an
earlier revision (built from `git archive` of its kernels), side by side in alternating
rounds, with the KV bytes' rate next to the machine's read bandwidth measured in the same run.

    .venv/bin/python bench/decode_attention.py [--threads 2] [--contexts 4096,16384,65536]
                                               [--seqs 1,4] [--baseline 154d695]

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
from freetoken.experts.membw import read_bandwidth
from freetoken.kernels.pool import CpuPool
from freetoken.layers.attention import attend_rows

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


def case(ctx: int, seqs: int, hq=32, hkv=4, d=128, block=16):
    g = torch.Generator().manual_seed(ctx + seqs)
    blocks_per_seq = -(-ctx // block)
    rows = (blocks_per_seq * seqs + 1) * block
    k = torch.randn(rows, hkv, d, generator=g).bfloat16()
    v = torch.randn(rows, hkv, d, generator=g).bfloat16()
    order = torch.randperm(blocks_per_seq * seqs, generator=g) + 1
    slots = (order.view(seqs, blocks_per_seq, 1) * block + torch.arange(block)).reshape(seqs, -1)[:, :ctx].contiguous()
    q = torch.randn(seqs, hq, d, generator=g)
    lens = torch.full((seqs,), ctx, dtype=torch.int64)
    return q, k, v, slots, lens, seqs * ctx * hkv * d * 2 * 2


def timed(pool, args, reps):
    attend_rows(pool, *args)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        attend_rows(pool, *args)
        ts.append(time.perf_counter() - t)
    return min(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--contexts", default="4096,16384,65536")
    ap.add_argument("--seqs", default="1,4")
    ap.add_argument("--baseline", default="154d695", help="git revision whose kernel runs beside this tree's")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    new = CpuPool(kernels.load(), args.threads)
    old = CpuPool(build_revision(args.baseline), args.threads)
    bw = read_bandwidth(num_threads=args.threads)
    print(f"kernels {kernels.load().ft_isa().decode()}, {args.threads} threads, read bandwidth {bw / 1e9:.1f} GB/s "
          f"(ft_read_bytes, same run); baseline = {args.baseline}")
    print(f"{'context':>8}{'seqs':>5}{'KV MB':>8}{'new ms':>9}{'old ms':>9}{'new GB/s':>10}{'% of read':>10}{'speed-up':>10}")
    for ctx in map(int, args.contexts.split(",")):
        for seqs in map(int, args.seqs.split(",")):
            q, k, v, slots, lens, nbytes = case(ctx, seqs)
            a = (q, k, v, slots, lens, 128 ** -0.5)
            reps = max(3, int(2e8 // nbytes))
            t_new, t_old = [], []
            for r in range(args.rounds):
                for which in ((new, t_new), (old, t_old))[:: 1 if r % 2 == 0 else -1]:
                    which[1].append(timed(which[0], a, reps))
            tn, to = statistics.median(t_new), statistics.median(t_old)
            print(f"{ctx:8}{seqs:5}{nbytes / 1e6:8.1f}{tn * 1e3:9.3f}{to * 1e3:9.3f}{nbytes / tn / 1e9:10.1f}"
                  f"{nbytes / tn / bw:10.0%}{to / tn:9.2f}x", flush=True)


if __name__ == "__main__":
    main()
