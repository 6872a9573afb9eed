"""NVFP4 vs MXFP4 expert kernels side by side: B_H (weight + scale bytes of the distinct experts a
call touches / call time) and weights per second, alternating the two formats over several
rounds in one process and printing the median ratios (robust on a shared machine).

    .venv/bin/python bench/nvfp4_vs_mxfp4.py                     # 2048 x 768 experts, decode
    .venv/bin/python bench/nvfp4_vs_mxfp4.py --tokens 1,4 --rounds 7 --per-core

NVFP4 carries one e4m3 scale per 16 weights and a float per row (0.5625 + 4/in B/weight) where
MXFP4 has one e8m0 per 32 (0.53125 B/weight): at equal B_H, NVFP4 runs ~6% fewer weights/s."""
from __future__ import annotations

import argparse
import statistics

import torch

from freetoken.experts.execution.cpu import CpuExpertExecutor
from freetoken.experts.measure.membw import expert_nbytes, measure_expert_bandwidth

from cpu_experts import build_banks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--tokens", default="1")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=0.6, help="per format per round")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--per-core", action="store_true", help="1 thread, timed by the thread's CPU clock")
    a = ap.parse_args()
    clock = "thread" if a.per_core else "wall"
    threads = 1 if a.per_core else a.threads
    ex = {f: CpuExpertExecutor(build_banks(f, a.experts, a.hidden, a.inter), f, a.hidden, a.inter,
                               num_threads=threads) for f in ("mxfp4", "nvfp4")}
    weights = 3 * a.hidden * a.inter
    print(f"shapes: hidden {a.hidden}, intermediate {a.inter}, {a.experts} experts, top-{a.top_k}, "
          f"isa {ex['nvfp4'].isa}, threads {ex['nvfp4'].num_threads}, clock {clock}")
    for f, e in ex.items():
        print(f"  {f}: {expert_nbytes(e) / weights:.4f} B/weight")
    print(f"{'tok':>3s} {'mxfp4 GB/s':>10s} {'nvfp4 GB/s':>10s} {'B_H nv/mx':>9s} {'weights/s nv/mx':>15s}  (medians of {a.rounds})")
    for t in [int(v) for v in a.tokens.split(",")]:
        bh = {"mxfp4": [], "nvfp4": []}
        for _ in range(a.rounds):
            for f, e in ex.items():
                bh[f].append(measure_expert_bandwidth(e, tokens=t, top_k=a.top_k, seconds=a.seconds, clock=clock))
        ratios = [n / m for n, m in zip(bh["nvfp4"], bh["mxfp4"])]
        per = {f: expert_nbytes(e) for f, e in ex.items()}
        wr = [r * per["mxfp4"] / per["nvfp4"] for r in ratios]
        print(f"{t:3d} {statistics.median(bh['mxfp4']) / 1e9:10.1f} {statistics.median(bh['nvfp4']) / 1e9:10.1f} "
              f"{statistics.median(ratios):9.3f} {statistics.median(wr):15.3f}", flush=True)
    for e in ex.values():
        e.close()


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
