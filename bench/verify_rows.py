"""How near its ceiling the dense GEMV runs a verify's rows: the dense bench model's linear layers
(bench/speculative.py --model dense: qkv 5120x2048, o 2048x4096, gate|up 12288x2048, down
2048x6144 in each of 4 layers, lm_head 8192x2048; bf16 weights x bf16-rounded activations,
vdpbf16ps where the build has it) at each row count of a decode or verify step, one thread, each
call timed on the thread's CPU clock, rounds alternating the row counts (a shared machine's load
falls on all alike), medians. Beside them the roofline of the same work on this thread: the
weights read at the probe's read bandwidth, the multiply-adds at the probe's vdpbf16ps peak
(kernels/roofline.py, one thread, best burst), and the larger of the two.

    PYTHONPATH=. .venv/bin/python bench/verify_rows.py [--rows 1,2,5,9,13,17] [--rounds 9]

Per row count: the step's linears in ms, x the 1-row step, GFLOP/s, % of the vdpbf16ps peak,
and the roofline's ms (what no kernel of this arithmetic can beat on this thread)."""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from vs_llamacpp import isa_line  # noqa: E402

# (N, K, count in the model) of the dense bench model's linear layers (bench/speculative.py MEDIUM_DENSE)
SHAPES = {"qkv": (5120, 2048, 4), "o": (2048, 4096, 4), "gate|up": (12288, 2048, 4), "down": (2048, 6144, 4),
          "lm_head": (8192, 2048, 1)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,2,5,9,13,17")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    from freetoken.kernels.pool import shared_pool
    from freetoken.kernels.roofline import measure_machine
    from freetoken.layers.linear import Linear
    torch.set_num_threads(1)
    rows = [int(m) for m in args.rows.split(",")]
    machine = measure_machine(1, clock=time.process_time)
    if "bf16" not in machine.peak:
        sys.exit("no vdpbf16ps here: the bf16 dot GEMV is emulated, no peak to read it against")
    peak, bw = machine.peak["bf16"], machine.read_bw
    pool = shared_pool(1)
    pool.lib.ft_set_bf16_dot(1)
    # two copies of each layer, used in turn: a layer's weights come from DRAM as in a decode step
    layers = {name: [Linear(torch.randn(n, k).bfloat16(), compute_dtype=torch.float32, pool=pool) for _ in range(2)]
              for name, (n, k, _) in SHAPES.items()}
    xs = {(name, m): torch.randn(m, k) for name, (_, k, _) in SHAPES.items() for m in rows}
    times = {(name, m): [] for name in SHAPES for m in rows}
    for r in range(args.rounds):
        for m in (rows if r % 2 == 0 else rows[::-1]):
            for name, pair in layers.items():
                for lin in pair:
                    t = time.thread_time()
                    lin(xs[(name, m)])
                    times[(name, m)].append(time.thread_time() - t)
    pool.lib.ft_set_bf16_dot(0)
    weight_bytes = sum(2 * n * k * c for n, k, c in SHAPES.values())
    print(isa_line(1))
    print(f"one thread: read {bw / 1e9:.1f} GB/s, vdpbf16ps peak {peak / 1e9:.0f} GFLOP/s (roofline probes); "
          f"the step's linears: {weight_bytes / 2**20:.0f} MiB of bf16 weights")
    print(f"{'rows':>4} {'ms':>8} {'x 1 row':>8} {'GFLOP/s':>8} {'% peak':>7} {'roofline ms':>12}   per layer GFLOP/s")
    base = None
    for m in rows:
        ms = sum(statistics.median(times[(name, m)]) * c for name, (_, _, c) in SHAPES.items()) * 1e3
        base = base or ms
        flop = weight_bytes * m            # 2 FLOP per weight per row, 2 bytes per weight
        roof = max(weight_bytes / bw, flop / peak) * 1e3
        per = ", ".join(f"{name} {2 * n * k * m / statistics.median(times[(name, m)]) / 1e9:.0f}"
                        for name, (n, k, _) in SHAPES.items())
        print(f"{m:4d} {ms:8.2f} {ms / base:7.2f}x {flop / ms / 1e6:8.0f} {100 * flop / ms / 1e6 / (peak / 1e9):6.0f}% "
              f"{roof:12.2f}   {per}", flush=True)


if __name__ == "__main__":
    main()
