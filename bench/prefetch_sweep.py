"""Sweep the next-layer prefetch threshold of the engine's expert cache on routing traces.

Every run replays the trace through the engine's own `SlotTable` (sim/policies/slot_table.py)
with `--policy` (a "+prefetch" policy, "+budget" too) at each threshold, beside plain `lru` and the policy
without prefetch. Prints, per (trace, capacity), the decode miss rate and the transfers
(every copy into the cache: admitted misses, prefill fills and prefetches) relative to LRU's.

  PYTHONPATH=. .venv/bin/python bench/prefetch_sweep.py --capacity 0.11,0.37 \\
      --trace ../shared/data/routing-traces/qwen3-30b-a3b/qwen.route.csv [--trace DIR:64 ...]
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter

from freetoken.experts.memory.slots import without_prefetch
from freetoken.sim.access import build_stream
from freetoken.sim.capacity import parse_capacity
from freetoken.sim.policies.slot_table import slot_policy
from freetoken.sim.trace import PREFILL

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from policy_bounds import load  # noqa: E402


def run(policy_cls, stream, slots) -> tuple[float, int]:
    """(decode miss rate, transfers): every assign into the table counts as one copy."""
    p = policy_cls(slots, stream.num_layers, stream.num_experts)
    t = p.table
    copies = Counter()
    assign = t.assign

    def counted(ids, s):
        copies["n"] += len(ids)
        return assign(ids, s)
    t.assign = counted
    p.place(Counter())
    acc = miss = 0
    for seg in stream.segments:
        for i, cell in enumerate(seg.cells):
            if seg.phase == PREFILL and seg.rows:
                p.prompt_rows(seg.layers[i], seg.rows[i])
            for k in cell:
                if seg.phase == PREFILL:
                    p.prefill_access(k)
                else:
                    acc += 1
                    miss += not p.access(k)
            if seg.phase != PREFILL:
                p.end_cell(cell)
    return miss / acc, copies["n"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", action="append", required=True, help="trace file or FLAME folder, optionally :N")
    ap.add_argument("--capacity", default="0.11,0.37")
    ap.add_argument("--policy", default="lrfu+admit+prefetch")
    ap.add_argument("--thresholds", default="0.2,0.3,0.4,0.5")
    args = ap.parse_args(argv)
    if "+prefetch" not in args.policy:
        print(f"prefetch_sweep: --policy {args.policy!r}: needs '+prefetch'", file=sys.stderr)
        return 2
    base = without_prefetch(args.policy)
    ths = [float(x) for x in args.thresholds.split(",")]
    print("| trace | capacity | lru | target | " + base + " | " + " | ".join(f"+prefetch t={x:g}" for x in ths) + " |")
    print("|---|---|---|---|---|" + "---|" * len(ths))
    for spec in args.trace:
        name, stream = load(spec)
        for cap in args.capacity.split(","):
            slots = parse_capacity(cap, stream.universe).slots
            lru, lru_copies = run(slot_policy("lru", "lru"), stream, slots)
            cells = []
            for cls in [slot_policy(base, base)] + [slot_policy(args.policy, args.policy, threshold=x) for x in ths]:
                rate, copies = run(cls, stream, slots)
                mark = "**" if rate <= 0.85 * lru else ""
                cells.append(f"{mark}{rate:.3f}{mark} ({copies / max(lru_copies, 1):.2f}x)")
            print(f"| {name} | {cap} | {lru:.3f} | {0.85 * lru:.3f} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
