"""Regenerate docs/routing-locality.md's numbers: every shared trace through `freetoken sim`.

    .venv/bin/python bench/routing_locality.py [--data ../shared/data/routing-traces] [--out /tmp/routing-locality]

Writes one JSON per run under --out (projections with the LRU and the LRFU engine cache),
the miss-curve PNGs under docs/img/, and prints
the markdown tables (miss rates at 11% and 37%, projections per preset) to stdout.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWEEP = "0.03,0.06,0.11,0.16,0.22,0.3,0.37,0.45,0.6,0.8"
PRESETS = ["rtx5090-desktop", "rtx4060-laptop", "rtx3090-server-6t", "rtx4090-server-6t", "rtx5090-server-6t"]
FLAME_EXPERT_BYTES = "4350000"  # (1.3B total - 290M active) / (8 layers x 58 idle experts) = 2.18M params, bf16

# (label, path under the data folder, extra flags)
TRACES = [
    ("mixtral-raw", "mixtral-8x7b-instruct-fp8/routing_raw.jsonl", []),
    ("mixtral-humaneval", "mixtral-8x7b-instruct-fp8/humaneval_routing.jsonl", ["--prompt-tokens", "16"]),
    ("mixtral-gsm8k-2", "mixtral-8x7b-instruct-fp8/gsm8k_2_routing.jsonl", ["--prompt-tokens", "16"]),
    ("mixtral-humaneval-2", "mixtral-8x7b-instruct-fp8/humaneval_2_routing.jsonl", ["--prompt-tokens", "16"]),
    ("qwen3-30b-a3b", "qwen3-30b-a3b/qwen.route.csv", []),
    ("gpt-oss-120b", "gpt-oss-120b/gptoss.route.csv", []),
    ("flame-moe-290m", "flame-moe-290m", ["--prompt-tokens", "64"]),
]


def sim(argv: list[str]) -> dict:
    cmd = [sys.executable, "-m", "freetoken.sim", *argv]
    print("$ freetoken sim " + " ".join(shlex.quote(a) for a in argv), file=sys.stderr)
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "routing-traces"))
    ap.add_argument("--out", default="/tmp/routing-locality")
    ap.add_argument("--skip-cache", action="store_true", help="reuse the cache-*.json already under --out")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (ROOT / "docs" / "img").mkdir(parents=True, exist_ok=True)
    miss_rows, proj_rows = [], []
    for label, rel, extra in TRACES:
        trace = str(Path(args.data) / rel)
        png = f"docs/img/miss-{label}.png"
        if args.skip_cache:
            cache = json.loads((out / f"cache-{label}.json").read_text())
        else:
            cache = sim(["cache", "--trace", trace, "--capacity", SWEEP, "--policy", "all", "--json", "--plot", png, *extra])
            (out / f"cache-{label}.json").write_text(json.dumps(cache, indent=1))
        for cap in (0.11, 0.37):
            rates = {r["policy"]: r["miss_rate"] for r in cache["results"] if r["capacity"] == cap}
            miss_rows.append((label, cap, rates))
        sizes = ["--expert-bytes", FLAME_EXPERT_BYTES] if label.startswith("flame") else []
        for hw in PRESETS:
            for policy in ("lru", "lrfu"):
                proj = sim(["project", "--trace", trace, "--hardware", hw, "--cache", policy, "--json", *extra, *sizes])
                (out / f"project-{policy}-{label}-{hw}.json").write_text(json.dumps(proj, indent=1))
                proj_rows.append((label, hw, policy, proj))
    print_tables(miss_rows, [r for r in proj_rows if r[2] == "lru"])
    print_cache_gain(proj_rows)
    return 0


def print_tables(miss_rows, proj_rows) -> None:
    policies = list(miss_rows[0][2])
    print("| trace | capacity | " + " | ".join(policies) + " |")
    print("|---|---|" + "---|" * len(policies))
    for label, cap, rates in miss_rows:
        best = min(v for k, v in rates.items() if k != "belady")
        cells = [f"**{rates[p]:.3f}**" if p != "belady" and rates[p] == best else f"{rates[p]:.3f}" for p in policies]
        print(f"| {label} | {cap:.0%} | " + " | ".join(cells) + " |")
    print()
    splits = ["all-fill", "all-cpu", "fixed", "q*", "balanced", "greedy-q"]
    print("| trace | hardware | capacity | " + " | ".join(splits) + " | best fixed f | q* / best(fill, cpu) | balanced / best(fill, cpu) |")
    print("|---|---|---|" + "---|" * (len(splits) + 3))
    for label, hw, _, proj in proj_rows:
        for sp in proj["speedup"]:
            cap = sp["capacity"]
            tps = {r["split"]: r["tokens_per_second"] for r in proj["results"] if r["capacity"] == cap}
            base = max(tps["all-fill"], tps["all-cpu"])
            print(
                f"| {label} | {hw} | {cap:.0%} | " + " | ".join(f"{tps[s]:.1f}" for s in splits)
                + f" | {sp['best_fixed_fraction']:g} ({sp['best_fixed_tokens_per_second']:.1f}) | {tps['q*'] / base:.2f}x | {tps['balanced'] / base:.2f}x |"
            )



def tokens_per_second(proj: dict, cap: float) -> dict[str, float]:
    return {r["split"]: r["tokens_per_second"] for r in proj["results"] if r["capacity"] == cap}


def print_cache_gain(proj_rows) -> None:
    """LRFU engine cache over LRU: tok/s ratio per rule, geometric mean over traces and capacities."""
    import math

    by_key = {(label, hw, policy): proj for label, hw, policy, proj in proj_rows}
    rules = ["all-fill", "q*", "balanced", "best fixed"]
    print()
    print("| hardware | " + " | ".join(f"{r}: lrfu / lru" for r in rules) + " |")
    print("|---|" + "---|" * len(rules))
    for hw in PRESETS:
        ratios = {r: [] for r in rules}
        for label, _, _ in TRACES:
            if label == "mixtral-humaneval":
                continue  # the same decode records as mixtral-raw
            lru, lrfu = by_key[(label, hw, "lru")], by_key[(label, hw, "lrfu")]
            for a, b in zip(lru["speedup"], lrfu["speedup"]):
                ta, tb = tokens_per_second(lru, a["capacity"]), tokens_per_second(lrfu, b["capacity"])
                for r in rules[:-1]:
                    ratios[r].append(tb[r] / ta[r])
                ratios["best fixed"].append(b["best_fixed_tokens_per_second"] / a["best_fixed_tokens_per_second"])
        cells = []
        for r in rules:
            xs = ratios[r]
            gm = math.exp(sum(map(math.log, xs)) / len(xs))
            cells.append(f"{gm:.3f}x [{min(xs):.2f}, {max(xs):.2f}]")
        print(f"| {hw} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
