"""``freetoken sim``: ``cache`` (policy miss rates) and ``project`` (hardware tok/s).

``register(subparsers)`` adds the ``sim`` command to the main parser; each leaf sets
``func`` to a callable taking the parsed args and returning an exit code. Bad input
prints one line naming the file/field on stderr and returns 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from freetoken.experts.memory.slots import DEFAULT_POLICY, POLICIES as CACHE_POLICIES, parse_policy
from freetoken.sim.access import build_stream
from freetoken.sim.capacity import Capacity, parse_capacity
from freetoken.sim.hardware import HardwareError, load_hardware, preset_names
from freetoken.sim.policies import POLICIES, parse_policies
from freetoken.sim.projection import SPLITS, best_fixed_fraction, model_bytes, planner_rates, project
from freetoken.sim.readers import load_trace
from freetoken.sim.replay import replay
from freetoken.sim.trace import Trace, TraceError, with_prompt_tokens

DEFAULT_CAPACITIES = "0.11,0.37"


def register(subparsers) -> argparse.ArgumentParser:
    sim = subparsers.add_parser("sim", help="replay routing traces: cache policies and hardware projection")
    sim_sub = sim.add_subparsers(dest="sim_command", metavar="{cache,project,sessions}")
    sim_sub.required = True

    cache = sim_sub.add_parser("cache", help="decode miss rate per cache policy and capacity")
    _trace_args(cache)
    cache.add_argument("--policy", default="all", help=f"one of {', '.join(POLICIES)}, a comma list, or all")
    cache.add_argument("--plot", metavar="FILE.png", help="draw miss rate vs capacity curves")
    cache.set_defaults(func=run_cache)

    proj = sim_sub.add_parser("project", help="projected decode tok/s per miss-split rule on a machine")
    _trace_args(proj)
    proj.add_argument("--hardware", required=True, help=f"a preset ({', '.join(preset_names())}) or a profile JSON")
    proj.add_argument("--fraction", type=float, default=0.5, help="fill fraction of the fixed hybrid (default 0.5)")
    proj.add_argument("--expert-bytes", type=float, help="bytes per expert, when the trace does not record it")
    proj.add_argument("--device-gbps", type=float, help="device memory bandwidth, when the hardware file lacks it")
    proj.add_argument("--cache", default=DEFAULT_POLICY, type=_cache_policy,
                      help=f"the engine cache's policy: {', '.join(CACHE_POLICIES)}, optionally +admit, +layer, +prefetch, +budget, +prompt (default {DEFAULT_POLICY})")
    proj.set_defaults(func=run_project)

    from freetoken.sim.sessions.cli import add_parser as add_sessions
    add_sessions(sim_sub)
    return sim


def _cache_policy(name: str) -> str:
    try:
        parse_policy(name)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return name


def _trace_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, help="a trace file (or FLAME layer folder)")
    p.add_argument("--capacity", default=DEFAULT_CAPACITIES, help="comma list: fractions of L*E (0.37, 37%%) or slot counts (512)")
    p.add_argument("--prompt-tokens", type=int, default=0, help="treat the first N decode steps of prompt-less sequences as the prompt")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _fail(message: str) -> int:
    print(f"freetoken sim: error: {message}", file=sys.stderr)
    return 2


def _load(args) -> tuple[Trace, list[Capacity]]:
    trace = with_prompt_tokens(load_trace(args.trace), args.prompt_tokens)
    trace.validate()
    universe = trace.num_layers * trace.num_experts
    caps = [parse_capacity(c, universe) for c in args.capacity.split(",") if c.strip()]
    if not caps:
        raise ValueError("--capacity: give at least one value")
    return trace, caps


def _describe(trace: Trace, out) -> None:
    print(trace.summary(), file=out)
    for note in trace.notes:
        print(f"  note: {note}", file=out)


def run_cache(args) -> int:
    try:
        trace, caps = _load(args)
        names = parse_policies(args.policy)
    except (TraceError, HardwareError, ValueError, OSError) as e:
        return _fail(str(e))
    stream = build_stream(trace)
    rows = [(c, replay(n, stream, c.slots)) for n in names for c in caps]
    if args.plot:
        from freetoken.sim.plot import plot_miss_curves

        title = f"{trace.name} ({trace.model}, top-{trace.top_k})"
        try:
            plot_miss_curves([r for _, r in rows], stream.universe, title, args.plot)
        except OSError as e:
            return _fail(f"{args.plot}: cannot write the plot ({e.strerror or e})")
    if args.json:
        _describe(trace, sys.stderr)
        results = [
            {"policy": r.policy, "capacity": c.requested, "slots": r.slots, "accesses": r.accesses, "miss_rate": r.miss_rate,
             "prefetches": r.prefetches}
            for c, r in rows
        ]
        print(json.dumps({"results": results}))
        return 0
    _describe(trace, sys.stdout)
    print(f"decode miss rate ({stream.decode_accesses()} decode accesses)")
    head = ["policy"] + [f"{c.requested} ({c.slots} slots)" for c in caps]
    table = [[n] + [f"{r.miss_rate:.3f}" for _, r in rows if r.policy == n] for n in names]
    _print_table(head, table)
    ahead = [(c, r) for c, r in rows if r.prefetches]
    if ahead:
        print("copies made ahead of use (prefetches, each a transfer): " +
              ", ".join(f"{r.policy} @ {c.requested}: {r.prefetches}" for c, r in ahead))
    return 0


def run_project(args) -> int:
    try:
        trace, caps = _load(args)
        hw = load_hardware(args.hardware, args.device_gbps)
        experts, dense = model_bytes(trace, args.expert_bytes)
    except (TraceError, HardwareError, ValueError, OSError) as e:
        return _fail(str(e))
    stream = build_stream(trace)
    tokens = trace.decode_tokens()
    results = []
    for c in caps:
        runs = {s: project(stream, tokens, hw, c.slots, s, experts, dense, args.fraction, args.cache) for s in SPLITS}
        base = max(runs["all-fill"].tokens_per_second, runs["all-cpu"].tokens_per_second)
        best = best_fixed_fraction(stream, tokens, hw, c.slots, experts, dense, cache_policy=args.cache)
        results.append((c, runs, runs["q*"].tokens_per_second / base, best))
    if args.json:
        _describe(trace, sys.stderr)
        out = [
            {
                "capacity": c.requested, "slots": c.slots, "split": s, "tokens_per_second": p.tokens_per_second,
                "hits_per_token": p.hits / tokens, "fills_per_token": p.fills / tokens, "cpu_experts_per_token": p.cpu / tokens,
            }
            for c, runs, _, _ in results for s, p in runs.items()
        ]
        speedups = [
            {"capacity": c.requested, "q_star_over_best_of_fill_and_cpu": x,
             "best_fixed_fraction": f, "best_fixed_tokens_per_second": p.tokens_per_second}
            for c, _, x, (f, p) in results
        ]
        print(json.dumps({"hardware": hw.name, "cache": args.cache, "results": out, "speedup": speedups}))
        return 0
    _describe(trace, sys.stdout)
    b_p, b_h = planner_rates(hw)
    print(
        f"hardware {hw.name}: link {hw.link_gbps:g} GB/s, CPU experts {hw.cpu_gbps:g} GB/s alone "
        f"(both running: {hw.link_concurrent_gbps:.1f} / {hw.cpu_concurrent_gbps:.1f}; q* from B_P {b_p:.1f}, "
        f"B_H {b_h:.1f}), device {hw.device_gbps:g} GB/s; "
        f"expert {experts[0] / 2**20:.2f} MiB; engine cache {args.cache}"
    )
    head = ["split"] + [f"{c.requested} ({c.slots} slots) tok/s" for c, *_ in results]
    table = [[s if s != "fixed" else f"fixed {args.fraction:g}"] + [f"{r[1][s].tokens_per_second:.1f}" for r in results] for s in SPLITS]
    table.append(["best fixed (swept)"] + [f"{p.tokens_per_second:.1f} @ {f:g}" for *_, (f, p) in results])
    table.append(["q* / max(all-fill, all-cpu)"] + [f"{x:.2f}x" for _, _, x, _ in results])
    _print_table(head, table)
    return 0


def _print_table(head: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    for r in [head, ["-" * w for w in widths]] + rows:
        print("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))))
