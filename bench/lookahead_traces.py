"""Next-layer lookahead on the shared routing traces: the share of the next layer's misses the
guesses cover, and the wasted reads per useful read (issue 39 item 2; antirez/ds4 reports 46%
covered at 0.4 wasted per useful with router top-4 guesses).

The traces hold routing only (no hidden states), so the guess replayed here is the history
predictor's (experts/memory/next_layer.py, learned online from the prompt and the decode so
far: what the engine's `--expert-lookahead history` reads, and what `auto` reads where it
guesses better than the router); the router's own guess needs the model (the engine's stats:
`lookahead` in /v1/memory, `bench/disk_tier.py` prints it). Per (trace, capacity), the engine's
cache (`SlotTable`, `--policy`, by default the default policy) replayed twice, decode cells in order:
  without lookahead            the policy without '+prefetch' (and '+budget', '+path'): its decode misses M
  with lookahead               the policy with '+prefetch': after each decode cell the guesses
                               for the next layer not resident are read into the policy's victims
                               (landed in time; with '+budget', only within its transfer budget)
  covered = guessed reads that were routed before being evicted / M
  wasted per useful = guessed reads evicted unused / guessed reads used

  D=/work/shared/data/routing-traces
  PYTHONPATH=. .venv/bin/python bench/lookahead_traces.py --capacity 0.05,0.11,0.37 \\
      --trace $D/mixtral-8x7b-instruct-fp8/routing_raw.jsonl --trace $D/qwen3-30b-a3b/qwen.route.csv ...
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from freetoken.experts.memory.slots import DEFAULT_POLICY, without_prefetch
from freetoken.sim.capacity import parse_capacity
from freetoken.sim.policies.slot_table import slot_policy
from freetoken.sim.replay import prefill_cells
from freetoken.sim.trace import PREFILL

sys.path.insert(0, str(Path(__file__).resolve().parent))
from policy_bounds import load  # noqa: E402


def lookahead_replay(stream, slots: int, policy: str) -> dict:
    """The policy (a '+prefetch' one), counting each prefetched key's fate."""
    p = slot_policy(policy, policy)(slots, stream.num_layers, stream.num_experts)
    t = p.table
    p.prepare(stream)
    p.place(Counter())
    waiting: set[int] = set()            # prefetched, not routed yet, still resident
    used = wasted = misses = accesses = 0

    def sweep():
        nonlocal wasted
        gone = [k for k in waiting if t.slot_of[k] < 0]
        wasted += len(gone)
        waiting.difference_update(gone)

    for seg in stream.segments:
        if seg.phase == PREFILL:
            for _ in prefill_cells(p, seg):
                sweep()
            continue
        for cell in seg.cells:
            mine = waiting.intersection(cell)
            used += len(mine)
            waiting.difference_update(mine)
            hits = p.access_cell(cell)
            accesses += len(cell)
            misses += len(cell) - int(np.sum(hits))
            sweep()
            if t.predictor is not None:
                keys, victims = t.prefetch_after(np.asarray(cell, np.int64))
                if len(keys):
                    t.assign(keys, victims)
                    t.ready(victims)
                    t.unlock(victims)
                    sweep()
                    waiting.update(keys.tolist())
    return {"used": used, "wasted": wasted, "misses": misses, "accesses": accesses, "prefetches": t.prefetches}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", action="append", required=True, help="trace file or FLAME folder, optionally :N")
    ap.add_argument("--capacity", default="0.05,0.11,0.37")
    ap.add_argument("--policy", default=DEFAULT_POLICY, help="the cache policy ('+prefetch' is added if missing)")
    args = ap.parse_args(argv)
    policy = args.policy if "+prefetch" in args.policy else without_prefetch(args.policy) + "+prefetch"
    base = without_prefetch(policy)
    head = ["trace", "capacity", "misses without", "misses with", "next-layer misses covered",
            "wasted reads per useful read", "guessed reads"]
    print(f"policy {policy} (without lookahead: {base}); guesses: history predictor (next_layer.py)")
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for spec in args.trace:
        name, stream = load(spec)
        for cap in args.capacity.split(","):
            slots = parse_capacity(cap, stream.universe).slots
            plain = lookahead_replay(stream, slots, base)         # (no predictor: no guesses)
            la = lookahead_replay(stream, slots, policy)
            cov = la["used"] / plain["misses"] if plain["misses"] else 0.0
            waste = la["wasted"] / la["used"] if la["used"] else float("nan")
            print(f"| {name} | {cap} | {plain['misses'] / max(1, plain['accesses']):.3f} | {la['misses'] / max(1, la['accesses']):.3f} | "
                  f"{cov:.0%} | {waste:.2f} | {la['prefetches']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
