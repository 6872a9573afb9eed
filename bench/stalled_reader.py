"""Does a client that stops reading hurt the others? Two soaks side by side on fresh
servers, the same clients and seed, without and with stalled readers; prints each run's
inter-token latency and the ratio (target: p99 within 2x).

    python bench/stalled_reader.py --clients 8 --stalled 2 --duration 60
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
    p.add_argument("--duration", type=float, default=60.0)
    a = p.parse_args(argv)
    runs = {}
    for k in (0, a.stalled):
        args = soak.parse_args(["--clients", str(a.clients), "--duration", str(a.duration),
                                "--stalled", str(k), "--rss-growth-pct", "100"])
        runs[k] = asyncio.run(soak.run(args))
        soak.print_report(runs[k])
    base, st = runs[0]["itl_s"], runs[a.stalled]["itl_s"]
    print(f"inter-token p50 {base['p50'] * 1000:.1f} -> {st['p50'] * 1000:.1f} ms, "
          f"p99 {base['p99'] * 1000:.1f} -> {st['p99'] * 1000:.1f} ms with {a.stalled} stalled readers: "
          f"p99 ratio {st['p99'] / base['p99']:.2f}x (target < 2x)")
    ok = all(r["ok"] for r in runs.values()) and st["p99"] < 2 * base["p99"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
