"""Sweep the LRFU half-life of the engine's expert cache on routing traces.

Every run replays the trace through the engine's own `SlotTable` (sim/policies/slot_table.py)
with `--policy` (default: the engine's default, lrfu+admit) at each half-life, beside plain
`lru`; prints the decode miss rate per (trace, capacity) and half-life as a markdown table.

  .venv/bin/python bench/policy_sweep.py --capacity 0.11,0.37 \\
      --trace ../shared/data/routing-traces/qwen3-30b-a3b/qwen.route.csv [--trace DIR:64 ...]

A trace may end in `:N` to relabel the first N decode steps of prompt-less sequences as the
prompt (`freetoken sim cache --prompt-tokens N`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from freetoken.experts.memory.slots import DEFAULT_POLICY, parse_policy
from freetoken.sim.access import build_stream
from freetoken.sim.capacity import parse_capacity
from freetoken.sim.policies.slot_table import slot_policy
from freetoken.sim.readers import load_trace
from freetoken.sim.replay import replay
from freetoken.sim.trace import with_prompt_tokens

HALF_LIVES = (8, 16, 32, 64, 128, 512)


def _miss_rate(policy_cls, stream, slots) -> float:
    # replay() looks policies up by name: register this one under a private name
    from freetoken.sim import policies
    name = f"sweep-{id(policy_cls)}"
    policies.POLICIES[name] = policy_cls
    try:
        return replay(name, stream, slots).miss_rate
    finally:
        del policies.POLICIES[name]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", action="append", required=True, help="trace file or FLAME folder, optionally :N")
    ap.add_argument("--capacity", default="0.11,0.37")
    ap.add_argument("--policy", default=DEFAULT_POLICY, help="an lrfu policy (lrfu or lrfu+admit)")
    ap.add_argument("--half-lives", default=",".join(map(str, HALF_LIVES)))
    args = ap.parse_args(argv)
    if parse_policy(args.policy)[0] != "lrfu":
        print(f"policy_sweep: --policy {args.policy!r}: only lrfu has a half-life", file=sys.stderr)
        return 2
    lives = [float(x) for x in args.half_lives.split(",")]
    print(f"| trace | capacity | lru | " + " | ".join(f"{args.policy} h={h:g}" for h in lives) + " |")
    print("|---|---|---|" + "---|" * len(lives))
    for spec in args.trace:
        path, _, prompt = spec.rpartition(":") if spec.rpartition(":")[2].isdigit() else (spec, "", "0")
        trace = with_prompt_tokens(load_trace(path), int(prompt))
        trace.validate()
        stream = build_stream(trace)
        for cap in args.capacity.split(","):
            c = parse_capacity(cap, stream.universe)
            lru = _miss_rate(slot_policy("lru", "lru"), stream, c.slots)
            rates = [_miss_rate(slot_policy(args.policy, args.policy, h), stream, c.slots) for h in lives]
            best = min(rates)
            cells = [f"**{r:.3f}**" if r == best else f"{r:.3f}" for r in rates]
            print(f"| {Path(path).name} | {cap} | {lru:.3f} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
