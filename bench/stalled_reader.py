"""Does a client that stops reading hurt the others? One soak on one server, with the
stalled readers connected only in alternate phases (`--phase` seconds each): the other
streams' inter-token gaps are split by the phase they ended in, so both figures share the
same server, clients and machine load (measured side by side, not one run after another).
Prints each phase kind's inter-token latency and the p99 ratio (target: within 2x).

    python bench/stalled_reader.py --clients 8 --stalled 2 --duration 120 --phase 20
"""
from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import soak  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--stalled", type=int, default=2)
    p.add_argument("--duration", type=float, default=120.0)
    p.add_argument("--phase", type=float, default=20.0, help="seconds per phase (alternating without/with)")
    a = p.parse_args(argv)
    args = soak.parse_args(["--clients", str(a.clients), "--duration", str(a.duration),
                            "--stalled", str(a.stalled), "--stall-phase", str(a.phase),
                            "--rss-growth-pct", "100"])
    r = asyncio.run(soak.run(args))
    soak.print_report(r)
    base, st = r["itl_by_phase_s"]["without_stalled"], r["itl_by_phase_s"]["with_stalled"]
    print(f"inter-token p50 {base['p50'] * 1000:.1f} -> {st['p50'] * 1000:.1f} ms, "
          f"p99 {base['p99'] * 1000:.1f} -> {st['p99'] * 1000:.1f} ms ({base['n']} / {st['n']} gaps) "
          f"with {a.stalled} stalled readers: p99 ratio {st['p99'] / base['p99']:.2f}x (target < 2x)")
    return 0 if r["ok"] and st["p99"] < 2 * base["p99"] else 1


if __name__ == "__main__":
    sys.exit(main())
