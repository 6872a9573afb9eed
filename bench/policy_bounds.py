"""Decode miss rates of cache policies beside the bounds that decide whether issue 17's target
(>= 15% fewer decode misses than global LRU) is reachable in a cell at all.

Per (trace, capacity): `lru`, the target line 0.85 x lru, the policies asked for, and
  belady            offline optimum, bypass and free placement at the trace start and at
                    the end of each prefill (any policy, prefetch included, is above it)
  belady-no-bypass  offline optimum that admits every miss
  belady-on-use     offline optimum of fetch-on-use policies (load only when routed,
                    bypass allowed): every replacement/admission rule without a predictor
  compulsory        first decode use of an entry never routed before (prefill included)
A shown engine policy's cell also gives its transfers (every copy into the cache, prefill
fills and prefetches included) relative to LRU's; the last lines count, per shown policy, the
cells meeting issue 39's target (misses <= 0.85x LRU's with transfers <= 1.1x LRU's). A cell is out of reach for every policy
without prefetch when belady > target, and for every policy
without prediction when belady-on-use > target.

  PYTHONPATH=. .venv/bin/python bench/policy_bounds.py --capacity 0.11,0.37 \\
      --policy lrfu+admit --trace $D/qwen3-30b-a3b/qwen.route.csv --trace $D/flame-moe-290m:64 ...

A trace may end in `:N` (`freetoken sim cache --prompt-tokens N`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from freetoken.sim.access import build_stream
from freetoken.sim.capacity import parse_capacity
from freetoken.sim.readers import load_trace
from freetoken.sim.replay import replay
from freetoken.sim.trace import with_prompt_tokens

BOUNDS = ("belady", "belady-no-bypass", "belady-on-use")


def load(spec: str):
    path, _, prompt = spec.rpartition(":") if spec.rpartition(":")[2].isdigit() else (spec, "", "0")
    trace = with_prompt_tokens(load_trace(path), int(prompt))
    trace.validate()
    return Path(path).name, build_stream(trace)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", action="append", required=True, help="trace file or FLAME folder, optionally :N")
    ap.add_argument("--capacity", default="0.11,0.37")
    ap.add_argument("--policy", default="default", help="comma list of sim policies to show")
    args = ap.parse_args(argv)
    shown = [p for p in args.policy.split(",") if p]
    head = ["trace", "capacity", "lru", "target (0.85 lru)", *shown, *BOUNDS, "compulsory",
            "any policy can", "fetch-on-use can"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    met = {p: [] for p in shown}
    for spec in args.trace:
        name, stream = load(spec)
        compulsory = replay("lru", stream, stream.universe).miss_rate
        for cap in args.capacity.split(","):
            slots = parse_capacity(cap, stream.universe).slots
            res = {p: replay(p, stream, slots) for p in ("lru", *shown, *BOUNDS)}
            rate = {p: r.miss_rate for p, r in res.items()}
            target = 0.85 * rate["lru"]
            cells = [name, cap, f"{rate['lru']:.3f}", f"{target:.3f}"]
            for p in shown:
                ratio = None if res[p].transfers is None else res[p].transfers / max(res['lru'].transfers, 1)
                moved = "" if ratio is None else f" ({ratio:.2f}x)"
                met[p].append(rate[p] <= target and ratio is not None and ratio <= 1.1)
                cells.append((f"**{rate[p]:.3f}**" if rate[p] <= target else f"{rate[p]:.3f}") + moved)
            cells += [f"**{rate[p]:.3f}**" if rate[p] <= target else f"{rate[p]:.3f}" for p in BOUNDS]
            cells += [f"{compulsory:.3f}", "yes" if rate["belady"] <= target else "NO",
                      "yes" if rate["belady-on-use"] <= target else "NO"]
            print("| " + " | ".join(cells) + " |", flush=True)
    for p, ok in met.items():
        print(f"{p}: misses <= 0.85x LRU with transfers <= 1.1x LRU in {sum(ok)} of {len(ok)} cells")
    return 0


if __name__ == "__main__":
    sys.exit(main())
