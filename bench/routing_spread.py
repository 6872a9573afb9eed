"""How far a model's routing spreads over the experts of a layer, beside a real model's trace:
the statistics that decide whether an expert cache (or llama.cpp's page cache) holds the
working set. For each layer, over the decoded positions (top-k cut to the reference's k, by
router weight, so a top-8 run compares with a top-6 trace):

  window W   distinct experts one layer needs over W consecutive positions (mean over layers
             and window starts): the working set a cache must hold to serve W tokens
  all N      distinct experts over the first N decoded positions (N: the shorter run's)
  reuse      of the accesses whose expert the layer used before in the decode: the median
             distance in positions, and the share at distance 1 (the previous token's)
  top 10%    share of the layer's accesses taken by its 13 most used experts (popularity skew)

  PYTHONPATH=. python bench/routing_spread.py --trace A.jsonl [--trace B.csv]
  PYTHONPATH=. python bench/routing_spread.py --gguf FILE [--decode 128] [--prompt-tokens 28]

A run of fewer layers than the reference is compared with the reference's first layers (the
synthetic file's layer l has layer l's gains whatever the layer count).
`--gguf` decodes greedily with FreeToken (disk tier, a small host cache: the 48-layer file
needs no 17 GiB of RAM) with `record_routing`, then compares with `--reference` (default: the
real Qwen3-30B-A3B trace under ../shared/data/routing-traces/). Exit status 1 when a
statistic is outside the tolerance (TOLERANCE: relative, each statistic).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REAL = next((p for p in (ROOT.parent / "shared", Path("/work/shared"))
             if (p / "data").is_dir()), ROOT.parent / "shared") / "data/routing-traces/qwen3-30b-a3b/qwen.route.csv"
WINDOWS = (1, 3, 5, 9, 17)
TOLERANCE = 0.15


def positions_csv(path: Path) -> tuple[dict[int, list[list[int]]], int]:
    """route_trace v1 (llama.cpp-based engine): per layer, each decoded position's experts in
    slot order (the router's order, highest weight first)."""
    cells: dict[tuple[int, int], dict[int, int]] = {}
    with open(path, encoding="utf-8") as f:
        for row in csv.reader(line for line in f if not line.startswith("#")):
            if row[0] == "turn" or row[1] != "1":
                continue
            step, layer, slot, expert = int(row[2]), int(row[3]), int(row[4]), int(row[5])
            cells.setdefault((layer, step), {})[slot] = expert
    return _by_layer({k: [[v[s] for s in sorted(v)]] for k, v in cells.items()}), 128


def positions_jsonl(path: Path) -> tuple[dict[int, list[list[int]]], int]:
    """FreeToken's routing trace: each decode record's rows sorted by weight, highest first."""
    cells = {}
    with open(path, encoding="utf-8") as f:
        head = json.loads(f.readline())
        for line in f:
            r = json.loads(line)
            if r["phase"] != "decode":
                continue
            rows = r["experts"]
            if "weights" in r:
                rows = [[e for _, e in sorted(zip(w, ids), key=lambda p: -p[0])] for ids, w in zip(rows, r["weights"])]
            cells[(r["layer"], r["step"])] = rows
    return _by_layer(cells), int(head["num_experts"])


def _by_layer(cells: dict[tuple[int, int], list[list[int]]]) -> dict[int, list[list[int]]]:
    out: dict[int, list[list[int]]] = {}
    for (layer, _), rows in sorted(cells.items()):
        out.setdefault(layer, []).extend(rows)
    return out


def load(path: Path):
    return positions_csv(path) if path.suffix == ".csv" else positions_jsonl(path)


def spread(layers: dict[int, list[list[int]]], k: int, n: int, experts: int) -> dict[str, float]:
    """The statistics of the module docstring over the first `n` positions, top-`k` each."""
    win = {w: [] for w in WINDOWS}
    alln, reuse, top = [], [], []
    for seq in layers.values():
        seq = [set(row[:k]) for row in seq[:n]]
        for w in WINDOWS:
            win[w] += [len(set().union(*seq[i:i + w])) for i in range(len(seq) - w + 1)]
        alln.append(len(set().union(*seq)))
        last: dict[int, int] = {}
        counts = [0] * experts
        for t, row in enumerate(seq):
            for e in row:
                if e in last:
                    reuse.append(t - last[e])
                last[e] = t
                counts[e] += 1
        top.append(sum(sorted(counts, reverse=True)[:experts // 10]) / max(1, sum(counts)))
    out = {f"window {w}": statistics.mean(win[w]) for w in WINDOWS}
    out[f"all {n}"] = statistics.mean(alln)
    out["reuse median"] = statistics.median(reuse) if reuse else float("nan")
    out["reuse at 1"] = sum(d == 1 for d in reuse) / max(1, len(reuse))
    out["top 10%"] = statistics.mean(top)
    return out


def table(named: dict[str, dict[str, float]], tolerance: float | None) -> bool:
    """Prints the statistics side by side (the first column is the reference); True if every
    other column is within `tolerance` of it."""
    names = list(named)
    ref = named[names[0]]
    print("| statistic | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    ok = True
    for key in ref:
        cells = [f"{named[n][key]:.3g}" for n in names]
        for i, n in enumerate(names[1:], 1):
            rel = abs(named[n][key] - ref[key]) / max(abs(ref[key]), 1e-9)
            within = tolerance is None or rel <= tolerance
            ok &= within
            cells[i] += f" ({named[n][key] / ref[key]:.2f}x{'' if within else ', out'})"
        print(f"| {key} | " + " | ".join(cells) + " |")
    return ok


def record(gguf: Path, decode: int, prompt_tokens: int, out: Path) -> None:
    """Greedy decode with the routing recorded, in a process of its own (disk tier)."""
    code = ("import sys, torch; from freetoken import LLM, SamplingParams; "
            "p, n, m, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]; "
            "llm = LLM(p, dtype='bfloat16', max_model_len=n + m + 8, prefix_cache=False, expert_tier='disk', "
            "host_cache_gib=1.0, speculative='off', record_routing=out); "
            "g = torch.Generator().manual_seed(0); "
            "ids = torch.randint(100, 150000, (m,), generator=g).tolist(); "
            "llm.generate([ids], SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)); llm.close()")
    subprocess.run([sys.executable, "-c", code, str(gguf), str(decode), str(prompt_tokens), str(out)], check=True,
                   cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, action="append", default=[], help="a trace (.csv route_trace or .jsonl)")
    ap.add_argument("--gguf", type=Path, help="decode this model with its routing recorded")
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=28, help="random prompt tokens (the real trace's prompt: 28)")
    ap.add_argument("--reference", type=Path, default=REAL)
    ap.add_argument("--top-k", type=int, default=6, help="experts a position kept (the reference's: 6)")
    args = ap.parse_args()
    traces = [args.reference, *args.trace]
    with tempfile.TemporaryDirectory() as tmp:
        if args.gguf is not None:
            traces.append(Path(tmp) / f"{args.gguf.stem}.jsonl")
            record(args.gguf, args.decode, args.prompt_tokens, traces[-1])
        runs = {p.name: load(p) for p in traces}
    # a file of fewer layers has the first layers of the 48 (their gains): compare with those
    first = min(len(layers) for layers, _ in runs.values())
    ref_layers, ref_experts = runs[traces[0].name]
    runs[traces[0].name] = ({l: v for l, v in ref_layers.items() if l < first}, ref_experts)
    n = min(len(seq) for layers, _ in runs.values() for seq in layers.values())
    named = {name: spread(layers, args.top_k, n, experts) for name, (layers, experts) in runs.items()}
    ok = table(named, TOLERANCE)
    verdict = "within" if ok else "OUTSIDE"
    print(f"tolerance {TOLERANCE:.0%} of the reference ({traces[0].name}), each statistic: {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
