"""A verify's attention: the decode kernel on 1 row vs the k + 1 rows of one sequence (a verify
of k drafts: row i reads the sequence's first ctx + i keys), this tree's kernel beside an earlier
revision's (`--baseline none` skips it), alternating rounds; this tree's kernel with its fp32 FMAs
and on AMX tiles (`--attention`), the earlier revision's on either (`--baseline-attention`).
Prints ms per layer call and what each extra row costs; the bf16 paged cache of `bench/decode_attention.py`, copies of it that
outgrow the last-level cache (a step's layers read their caches from DRAM). `--gemv`: also the
dense model's other per-row kernel, its 4 layers' GEMVs on AMX tiles at 1 and `--rows` rows.

    .venv/bin/python bench/verify_attention.py [--threads 1] [--contexts 256,800,1600] [--rows 9]
                                              [--heads 32,4] [--baseline ebb43cc|none] [--clock process]
                                              [--attention fp32|amx|both|bf16|fp32,bf16] [--baseline-attention fp32|amx|bf16]
                                              [--gemv]

Default shapes: the dense bench model's attention (`bench/speculative.py --model dense`: 32 query
heads, 4 KV heads, head_dim 128), one layer."""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from decode_attention import CLOCK, build_revision  # noqa: E402

from freetoken import kernels  # noqa: E402
from freetoken.kernels.pool import CpuPool  # noqa: E402
from freetoken.layers.attention.paged import attend_rows  # noqa: E402


def verify_case(ctx: int, rows: int, hq: int, hkv: int, d=128, block=16, seed=0):
    """(q, k, v, slots, lens, scale): `rows` queries of one sequence at positions ctx-1 .. ctx+rows-2."""
    g = torch.Generator().manual_seed(ctx + 1000 * seed)
    keys = ctx + rows - 1
    nblocks = -(-keys // block)
    k = torch.randn((nblocks + 1) * block, hkv, d, generator=g).bfloat16()
    v = torch.randn((nblocks + 1) * block, hkv, d, generator=g).bfloat16()
    order = torch.randperm(nblocks, generator=g) + 1
    seq = (order.view(nblocks, 1) * block + torch.arange(block)).reshape(-1)[:keys]
    slots = seq.expand(rows, keys).contiguous()
    q = torch.randn(rows, hq, d, generator=g)
    lens = torch.arange(ctx, ctx + rows, dtype=torch.int64)
    return q, k, v, slots, lens, d ** -0.5


def timed(pool, cases, reps, clock, amx=0, dot=0):
    """Best time per call over `reps` passes through all `cases` (`amx`: this tree's AMX attention;
    `dot`: the bf16-dot switch, bf16 scores and values with vdpbf16ps)."""
    now = CLOCK[clock]
    if hasattr(pool.lib, "ft_set_att_amx"):
        pool.lib.ft_set_att_amx(amx)
    pool.lib.ft_set_bf16_dot(dot)
    for a in cases:
        attend_rows(pool, *a)
    best = float("inf")
    for _ in range(reps):
        t = now()
        for a in cases:
            attend_rows(pool, *a)
        best = min(best, (now() - t) / len(cases))
    return best


def gemv_rows(pool, rows: int, rounds: int) -> tuple[float, float]:
    """CPU ms of the dense bench model's 4 layers of GEMVs (qkv, o, gate+up, down; bf16 weights,
    ~450 MB: from DRAM) on AMX tiles at 1 row and at `rows` rows: medians of alternating rounds."""
    from freetoken.layers.linear import Linear
    pool.lib.ft_set_gemv_amx(1)
    g = torch.Generator().manual_seed(0)
    shapes = [(5120, 2048), (2048, 4096), (12288, 2048), (2048, 6144)]
    layers = [[Linear(torch.randn(n, k, generator=g), None, compute_dtype=torch.float32,
                      storage_dtype=torch.bfloat16, pool=pool) for n, k in shapes] for _ in range(4)]
    xs = {m: [torch.randn(m, k, generator=g) for _, k in shapes] for m in (1, rows)}
    times = {1: [], rows: []}
    for r in range(rounds):
        for m in ((1, rows) if r % 2 == 0 else (rows, 1)):
            t = CLOCK["process"]()
            for layer in layers:
                for lin, x in zip(layer, xs[m]):
                    lin(x)
            times[m].append(CLOCK["process"]() - t)
    return tuple(statistics.median(times[m]) * 1e3 for m in (1, rows))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--contexts", default="256,800,1600")
    ap.add_argument("--rows", type=int, default=9, help="rows of the verify (k + 1)")
    ap.add_argument("--heads", default="32,4", help="query heads, KV heads")
    ap.add_argument("--baseline", default="ebb43cc", help="git revision whose kernel runs beside this tree's, or none")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--attention", choices=("fp32", "amx", "both", "bf16", "fp32,bf16"), default="both",
                    help="this tree's decode attention: the fp32 FMAs, the AMX tiles (where they run), both, the "
                         "bf16-dot switch's vdpbf16ps scores and values (bf16), or fp32 and bf16")
    ap.add_argument("--baseline-attention", choices=("fp32", "amx", "bf16"), default="fp32",
                    help="the baseline revision's decode attention (amx: its AMX tiles, for a before/after of the AMX "
                         "path; bf16: its bf16-dot switch's vdpbf16ps)")
    ap.add_argument("--clock", choices=CLOCK, default="process",
                    help="process: CPU time of this process (for --threads 1 on a shared machine); wall")
    ap.add_argument("--gemv", action="store_true", help="also the dense model's GEMVs per extra row (AMX tiles)")
    args = ap.parse_args()
    hq, hkv = map(int, args.heads.split(","))
    new = CpuPool(kernels.load(), args.threads)
    modes = {"fp32": ("fp32",), "amx": ("amx",), "both": ("fp32", "amx"), "bf16": ("bf16",),
             "fp32,bf16": ("fp32", "bf16")}[args.attention]
    if "amx" in modes and not new.lib.ft_set_att_amx(1):
        sys.exit("the AMX attention does not run here (no AMX-BF16, or the OS refuses the tile state)")
    pools = {n: new for n in modes}
    if args.baseline != "none":
        pools["old"] = CpuPool(build_revision(args.baseline), args.threads)
        if args.baseline_attention == "amx" and not (hasattr(pools["old"].lib, "ft_set_att_amx")
                                                     and pools["old"].lib.ft_set_att_amx(1)):
            sys.exit(f"{args.baseline} has no AMX decode attention (or it does not run here)")
    print(f"kernels {kernels.load().ft_isa().decode()}, {args.threads} threads, {hq} query / {hkv} KV heads x 128, "
          f"bf16 cache; ms per layer call, medians of {args.rounds} alternating rounds (best of {args.reps} each)"
          + ("" if len(pools) == 1 else f"; old = {args.baseline} ({args.baseline_attention})"))
    print(f"{'context':>8}" + "".join(f"{n + ' 1 row':>12}{n + f' {args.rows} rows':>13}{n + ' /xrow':>11}"
                                      for n in pools))
    for ctx in map(int, args.contexts.split(",")):
        nbytes = ctx * hkv * 128 * 4
        copies = max(1, -(-(96 << 20) // nbytes))
        one = [verify_case(ctx, 1, hq, hkv, seed=i) for i in range(copies)]
        many = [verify_case(ctx, args.rows, hq, hkv, seed=i) for i in range(copies)]
        times = {n: ([], []) for n in pools}
        for r in range(args.rounds):
            for n in list(pools)[:: 1 if r % 2 == 0 else -1]:
                amx = int(n == "amx" or (n == "old" and args.baseline_attention == "amx"))
                dot = int(n == "bf16" or (n == "old" and args.baseline_attention == "bf16"))
                times[n][0].append(timed(pools[n], one, args.reps, args.clock, amx, dot))
                times[n][1].append(timed(pools[n], many, args.reps, args.clock, amx, dot))
        line = f"{ctx:8}"
        for n in pools:
            t1, tr = (statistics.median(t) * 1e3 for t in times[n])
            line += f"{t1:12.3f}{tr:13.3f}{(tr - t1) / (args.rows - 1):11.3f}"
        print(line, flush=True)
    if args.gemv and new.lib.ft_set_gemv_amx(1):
        one, many = gemv_rows(new, args.rows, 4 * args.rounds)
        print(f"GEMVs of a dense step (4 layers, AMX tiles): 1 row {one:.2f} ms, {args.rows} rows {many:.2f} ms, "
              f"an extra row {(many - one) / (args.rows - 1):.3f} ms ({(many / one - 1) / (args.rows - 1):.2%} a row)")


if __name__ == "__main__":
    main()
