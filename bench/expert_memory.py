"""Two-tier expert memory: decode speed of offload / cpu / hybrid, and q* against fixed q.

    # the recorded table (docs/benchmarks.md): emulated CPU branch, far less sensitive to machine load
    .venv/bin/python bench/expert_memory.py --cpu-gbs 16 --link-gbs 2,8,32 --steps 24 --chunk 4 --fixed-q 1,2,3
    # real CPU kernels for the CPU branch (needs a quiet machine)
    .venv/bin/python bench/expert_memory.py [--layers 6] [--cache 0.1,0.3] [--link-gbs 2,16] [--threads 1]

What runs: the experts of a medium random model (bf16, qwen3-30b-a3b's 128 experts top-6
per layer, fewer layers and smaller experts so it fits this machine), driven at the
Experts seam by the real decode routing of Qwen3-30B-A3B (data/routing-traces; the prompt's
prefill first), so cache hit rates are the real workload's. The cache tier is host
memory behind an emulated link (a paced copy engine at --link-gbs GB/s). The "device"
executes its experts as an emulated accelerator (a sleep at 1 TB/s of weights: a GPU
runs a decode expert in microseconds), so the only real costs are what the paper's q*
weighs: link time and the CPU branch (the real CPU kernels, --threads threads; or, with
--cpu-gbs, an emulated CPU branch streaming weights at that rate, which makes the whole
machine emulated and, with --time-scale, immune to other programs on a shared box).

Rows: tok/s of the MoE part for cpu, offload, hybrid (online q* + split guard), hybrid with a static
wrong profile (25/50 GB/s, no online updates, no guard), and hybrid with fixed q swept over
--fixed-q; all run side by side in turns of --chunk steps (the box is shared and noisy). A few
steps run with the real device executor and are checked against the resident result.
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from freetoken.experts.measure.bandwidth import BandwidthEstimator  # noqa: E402
from freetoken.experts.memory.pool import ExpertPool, ExpertSpec  # noqa: E402
from freetoken.experts.execution.resident import ResidentExperts  # noqa: E402
from freetoken.experts.execution.tiered import CpuExperts, TieredExperts  # noqa: E402
from freetoken.experts.memory.transfer import PacedCopyEngine  # noqa: E402

TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "routing-traces" / "qwen3-30b-a3b" / "qwen.route.csv"
DEVICE_BYTES_PER_S = 1e12
SCALE = 1.0          # --time-scale: every emulated rate is divided by it, tok/s multiplied back


def load_trace(path: Path, layers: int):
    """prefill: per layer (ids [P,K], w [P,K]); decode: list of steps, each per layer (ids [1,K], w)."""
    rows = {}
    with open(path) as f:
        for row in csv.DictReader(line for line in f if not line.startswith("#")):
            layer = int(row["layer"])
            if layer < layers:
                key = (int(row["phase"]), int(row["step"]), layer)
                rows.setdefault(key, []).append((int(row["slot"]), int(row["expert"]), float(row["weight"])))
    cells = {k: sorted(v) for k, v in rows.items()}
    pre_steps = sorted({s for (p, s, _) in cells if p == 0})
    dec_steps = sorted({s for (p, s, _) in cells if p == 1})
    def arr(cell):
        return torch.tensor([[e for _, e, _ in cell]]), torch.tensor([[w for _, _, w in cell]])
    prefill = []
    for layer in range(layers):
        ids, ws = zip(*(arr(cells[(0, s, layer)]) for s in pre_steps if (0, s, layer) in cells))
        prefill.append((torch.cat(ids), torch.cat(ws)))
    decode = [[arr(cells[(1, s, layer)]) for layer in range(layers)] for s in dec_steps]
    return prefill, decode


def synthetic_trace(layers: int, experts: int, k: int, steps: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hot = [torch.randperm(experts, generator=g)[: 3 * k] for _ in range(layers)]
    def pick(layer, t):
        ids = torch.stack([hot[layer][torch.randperm(3 * k, generator=g)[:k]] for _ in range(t)])
        return ids, torch.softmax(torch.randn(t, k, generator=g), -1)
    return [pick(i, 28) for i in range(layers)], [[pick(i, 1) for i in range(layers)] for _ in range(steps)]


def make_pool(layers, experts, hidden, inter, seed=0) -> ExpertPool:
    g = torch.Generator().manual_seed(seed)
    n = layers * experts
    gu = torch.empty(n, 2 * inter, hidden, dtype=torch.bfloat16)
    dn = torch.empty(n, hidden, inter, dtype=torch.bfloat16)
    for i in range(0, n, 64):                     # chunked: no fp32 copy of the whole pool
        gu[i:i + 64] = torch.randn(min(64, n - i), 2 * inter, hidden, generator=g) / hidden ** 0.5
        dn[i:i + 64] = torch.randn(min(64, n - i), hidden, inter, generator=g) / inter ** 0.5
    return ExpertPool({"gate_up": gu, "down": dn}, layers, experts, ExpertSpec(hidden, inter))


def emulated_device(banks, spec, ids, x, weights, out=None):
    """An accelerator that runs these experts at DEVICE_BYTES_PER_S (no math: timing only)."""
    n = int(torch.unique(ids[ids >= 0]).numel())
    per = sum(b[0].nbytes for b in banks.values())
    t = n * per * SCALE / DEVICE_BYTES_PER_S
    if t > 100e-6:                                # shorter sleeps cost a reschedule, not t
        time.sleep(t)
    return out


def prefill_run(be, prefill, hidden_dim):
    be.begin_step("prefill")
    for layer, (ids, w) in enumerate(prefill):
        be.forward(layer, torch.randn(ids.shape[0], hidden_dim, dtype=torch.bfloat16), ids, w.bfloat16())


def decode_chunk(be, steps, hidden_dim) -> float:
    x1 = torch.randn(1, hidden_dim, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    for step in steps:
        be.begin_step("decode")
        for layer, (ids, w) in enumerate(step):
            be.forward(layer, x1, ids, w.bfloat16())
    return time.perf_counter() - t0


def side_by_side(backends: dict, prefill, decode, steps: int, chunk: int, hidden_dim: int) -> dict:
    """Decode tok/s of each backend, run in turns of `chunk` steps so that all of them see the
    same machine noise (the box is shared); each backend walks the same routing."""
    for be in backends.values():
        prefill_run(be, prefill, hidden_dim)
    rates = {name: [] for name in backends}
    steps = min(steps, len(decode))
    for at in range(0, steps, chunk):
        for name, be in backends.items():
            part = decode[at:at + chunk]
            rates[name].append(len(part) / decode_chunk(be, part, hidden_dim))
    return {name: SCALE * float(np.median(r)) for name, r in rates.items()}   # median turn: robust to bursts


def check_exact(pool, prefill, decode, slots, link, threads):
    ref = ResidentExperts(pool, torch.device("cpu"))
    be = TieredExperts(pool, torch.device("cpu"), slots, "hybrid", copy_engine=PacedCopyEngine(link),
                       host_executor=host(pool, threads), guard=False)
    worst = 0.0
    g = torch.Generator().manual_seed(1)
    for step in decode[:3]:
        be.begin_step("decode")
        for layer, (ids, w) in enumerate(step):
            x = torch.randn(1, pool.spec.hidden, generator=g).bfloat16()
            a, b = be.forward(layer, x, ids, w.bfloat16()), ref.forward(layer, x, ids, w.bfloat16())
            worst = max(worst, ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item())
    be.close()
    return worst


class SharedHost:
    """One CPU kernel pool for all backends of a comparison (they never run at once)."""

    def __init__(self, pool, threads):
        from freetoken.experts.execution.host_exec import make_host_executor
        self.ex = make_host_executor(pool, threads)

    def run(self, *a, **kw):
        return self.ex.run(*a, **kw)


class EmulatedHost:
    """A CPU branch that streams expert weights at exactly `bytes_per_s` (no math: timing only).
    With it the whole machine is emulated (link, CPU, device) and immune to this box's load."""

    def __init__(self, pool, bytes_per_s):
        self.S, self.rate = pool.expert_nbytes, bytes_per_s

    def run(self, x, expert_ids, weights, out=None):
        ids = torch.as_tensor(expert_ids)
        time.sleep(int(torch.unique(ids[ids >= 0]).numel()) * self.S / self.rate)
        return torch.zeros(x.shape[0], x.shape[1]) if out is None else out


def host(pool, threads):
    from freetoken.experts.execution.host_exec import make_host_executor
    return make_host_executor(pool, threads)


def tiered(pool, slots, policy, link, shared, estimator=None, fixed_q=None):
    be = TieredExperts(pool, torch.device("cpu"), slots, policy, copy_engine=PacedCopyEngine(link),
                       host_executor=shared, estimator=estimator, device_executor=emulated_device)
    be.planner.fixed_q = fixed_q
    return be


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--inter", type=int, default=256)
    ap.add_argument("--cache", default="0.1,0.3", help="cache sizes as fractions of the pool")
    ap.add_argument("--link-gbs", default="2,16", help="emulated link speeds, GB/s")
    ap.add_argument("--fixed-q", default="1,3,6")
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU-branch kernel threads (1 on a shared box: pinned spinning threads stall there)")
    ap.add_argument("--cpu-gbs", type=float, default=None,
                    help="emulate the CPU branch at this many GB/s instead of running the kernels")
    ap.add_argument("--time-scale", type=float, default=20.0,
                    help="with --cpu-gbs: run every emulated cost this many times slower and scale the "
                         "tok/s back, so thread wake-ups and Python overhead (large on a shared box) vanish")
    ap.add_argument("--chunk", type=int, default=8, help="decode steps per turn in the side-by-side rotation")
    ap.add_argument("--quick", action="store_true", help="one cache size, one link speed, fewer steps")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.quick:
        args.cache, args.link_gbs, args.steps, args.fixed_q = "0.25", "4", 32, "1,3,6"
    E, K = 128, 6
    if TRACE.exists():
        prefill, decode = load_trace(TRACE, args.layers)
        src = "qwen3-30b-a3b real routing"
    else:
        prefill, decode = synthetic_trace(args.layers, E, K, args.steps)
        src = "synthetic routing"
    pool = make_pool(args.layers, E, args.hidden, args.inter)
    S = pool.expert_nbytes
    n = args.layers * E
    print(f"# {args.layers} layers x {E} experts top-{K} ({src}), expert {S / 2**20:.2f} MiB bf16, "
          f"pool {pool.nbytes / 2**30:.2f} GiB, {min(args.steps, len(decode))} decode steps, "
          f"CPU branch {args.threads} threads", flush=True)
    err = check_exact(pool, prefill, decode, n // 4, 4e9, args.threads)
    print(f"# exactness (real device executor, hybrid q* without guard, 25% cache; bf16 CPU kernels vs torch): "
          f"max rel err {err:.1e}", flush=True)

    global SCALE
    SCALE = args.time_scale if args.cpu_gbs else 1.0
    shared = EmulatedHost(pool, args.cpu_gbs * 1e9 / SCALE) if args.cpu_gbs else SharedHost(pool, args.threads)
    print(f"# CPU branch: {f'emulated at {args.cpu_gbs:g} GB/s' if args.cpu_gbs else 'real kernels'}; "
          f"device: emulated at {DEVICE_BYTES_PER_S / 1e9:g} GB/s; link: paced copy thread; "
          f"time scale {SCALE:g} (emulated costs x{SCALE:g}, tok/s scaled back)", flush=True)
    fixed = [int(q) for q in args.fixed_q.split(",")]
    print("\n| cache | link GB/s | cpu | offload | hybrid | hybrid / max(cpu, offload) | hybrid fill fraction | "
          "hit % | guard | static wrong profile | " + " | ".join(f"q={q}" for q in fixed) + " | best fixed q |")
    print("|" + "---|" * (11 + len(fixed)))
    for frac in (float(c) for c in args.cache.split(",")):
        slots = int(n * frac)
        for gbs in (float(b) for b in args.link_gbs.split(",")):
            link = gbs * 1e9 / SCALE
            bes = {"cpu": CpuExperts(pool, torch.device("cpu"), shared),
                   "offload": tiered(pool, slots, "offload", link, shared),
                   "hybrid": tiered(pool, slots, "hybrid", link, shared),
                   "static": tiered(pool, slots, "hybrid", link, shared,
                                    BandwidthEstimator(25e9, 50e9, online=False))}
            bes["static"].guard = None
            bes.update({f"q={q}": tiered(pool, slots, "hybrid", link, shared, None, q) for q in fixed})
            res = side_by_side(bes, prefill, decode, args.steps, args.chunk, args.hidden)
            st = bes["hybrid"].stats()
            tot, guard = st["total"], st["guard"]
            for be in bes.values():
                be.close()
            best_fixed = max(fixed, key=lambda q: res[f"q={q}"])
            best = max(res["offload"], res["cpu"])
            print(f"| {frac:.0%} ({slots}) | {gbs:g} | {res['cpu']:.0f} | {res['offload']:.0f} | {res['hybrid']:.0f} | "
                  f"{res['hybrid'] / best:.2f} | {tot['fill_fraction']:.2f} | {100 * tot['hit_rate']:.0f} | "
                  f"{guard['winner']} | {res['static']:.0f} | "
                  + " | ".join(f"{res[f'q={q}']:.0f}" for q in fixed)
                  + f" | q={best_fixed}: {res[f'q={best_fixed}']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
