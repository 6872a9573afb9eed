"""The disk tier's overhead at hits: decode with every expert already in the host cache
against the fully resident pool, on the same GGUF, in one process (issue 39 item 4, target
>= 0.97x resident).

The two engines decode the same prompt greedily in lockstep: one step of one, then the same
step of the other (which goes first alternates step by step), each step timed on its own. A
step's ratio (resident seconds / disk-tier seconds) compares the same tokens at the same moment
of the machine, so a neighbour's burst or the machine's drift between rounds moves both sides
alike; the figure is the median of the per-step ratios over every round (the whole step:
attention, the lm head, the layer calls, the tier's own bookkeeping). The disk tier's host
cache holds the whole pool and is warmed first, so its decode reads nothing (the hit rate of
the measured steps is printed; >= 99% is the issue's condition); its tokens must be the
resident ones (checked). `--control` runs the same lockstep with a second resident engine in
the disk tier's place: the spread the comparison itself has on this machine at this load.

  PYTHONPATH=. .venv/bin/python bench/disk_hits.py --gguf ~/.cache/freetoken/bench/qwen3-moe-medium-q3_k_m.gguf \\
      --rounds 4 --decode 24 [--control] [--bookkeeping]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from freetoken import LLM, SamplingParams

HERE = Path(__file__).resolve().parent


def decode_steps(llm: LLM, prompt: list[int], n: int) -> tuple[list[float], list[int]]:
    """Seconds of each decode step (the prefill step left out) and the tokens."""
    eng = llm.engine
    eng.add_request("r", prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    times, toks, last = [], [], None
    while eng.has_unfinished():
        t0 = time.perf_counter()
        for out in eng.step():
            toks += out.new_token_ids
        if last is not None:
            times.append(time.perf_counter() - t0)
        last = t0
    return times, toks


def lockstep(res: LLM, disk: LLM, prompt: list[int], n: int) -> tuple[list[float], list[float], dict]:
    """Both engines decode `prompt` step by step in turn (the first of each pair alternating):
    (resident step seconds, disk-tier step seconds, tokens by engine), prefill steps left out."""
    engines = {"resident": res.engine, "disk": disk.engine}
    for eng in engines.values():
        eng.add_request("r", prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    secs: dict = {"resident": [], "disk": []}
    toks: dict = {"resident": [], "disk": []}
    step = 0
    while any(e.has_unfinished() for e in engines.values()):
        for name in (("resident", "disk") if step % 2 == 0 else ("disk", "resident")):
            eng = engines[name]
            if not eng.has_unfinished():
                continue
            t0 = time.perf_counter()
            for out in eng.step():
                toks[name] += out.new_token_ids
            if step:
                secs[name].append(time.perf_counter() - t0)
        step += 1
    return secs["resident"], secs["disk"], toks


def layer_calls(res: LLM, disk: LLM, reps: int, k: int, tokens: int = 1) -> tuple[float, float]:
    """Seconds of one MoE layer call, best of `reps`, resident vs disk tier at hits, summed over
    the layers: the experts seam alone (same hidden state, same routing), the two backends
    called alternately, so a neighbour's burst hits both alike and the best of many calls is
    the undisturbed one."""
    import numpy as np
    import torch
    a, b = res.engine.model.experts, disk.engine.model.experts
    L, E, H = b.layout.num_layers, b.E, b.layout.spec.hidden
    rng = np.random.default_rng(0)
    x = torch.randn(tokens, H, dtype=torch.bfloat16)
    ids = [torch.from_numpy(np.stack([rng.choice(E, k, replace=False) for _ in range(tokens)])) for _ in range(L)]
    w = torch.full((tokens, k), 1.0 / k, dtype=torch.bfloat16)
    for be in (a, b):
        be.begin_step("decode")
        for layer in range(L):
            be.forward(layer, x, ids[layer], w)           # the disk tier reads them here, once
    best = {id(a): [float("inf")] * L, id(b): [float("inf")] * L}
    for _ in range(reps):
        for layer in range(L):
            for be in (a, b):
                t0 = time.perf_counter()
                be.forward(layer, x, ids[layer], w)
                best[id(be)][layer] = min(best[id(be)][layer], time.perf_counter() - t0)
    return sum(best[id(a)]), sum(best[id(b)])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, default=Path.home() / ".cache/freetoken/bench/qwen3-moe-medium-q3_k_m.gguf")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--decode", type=int, default=24)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=200, help="MoE layer calls per backend and layer (best of)")
    ap.add_argument("--control", action="store_true",
                    help="also the same lockstep with a second resident engine in the disk tier's place: the "
                         "comparison's own spread on this machine (1.000x when it has none)")
    ap.add_argument("--bookkeeping", action="store_true",
                    help="also time the layer calls with the kernels replaced by no-ops: each backend's own Python work")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from vs_llamacpp import isa_line
    print(isa_line(args.threads))
    common = dict(dtype="bfloat16", num_threads=args.threads, max_model_len=512, prefix_cache=False, speculative="off")
    res = LLM(str(args.gguf), expert_tier="ram", **common)
    disk = LLM(str(args.gguf), expert_tier="disk", host_cache_slots=10**9, **common)
    prompt = [10 + (7 * i) % 500 for i in range(args.prompt_tokens)]
    for _ in range(2):                             # warm: the host cache takes every expert routed
        decode_steps(disk, prompt, args.decode)
    hc0 = dict(disk.expert_stats()["host_cache"])
    ratios: list[float] = []
    same = True
    for r in range(args.rounds):
        rs, ds, toks = lockstep(res, disk, prompt, args.decode)
        step_ratios = [a / b for a, b in zip(rs, ds)]
        ratios += step_ratios
        same &= toks["resident"] == toks["disk"]
        print(f"round {r}: resident {1 / statistics.median(rs):.2f} tok/s, disk tier at hits "
              f"{1 / statistics.median(ds):.2f} tok/s (median steps); per-step ratio median "
              f"{statistics.median(step_ratios):.3f}x; tokens identical {toks['resident'] == toks['disk']}", flush=True)
    hc = disk.expert_stats()["host_cache"]
    hits = hc["hits"] + hc["waited"] - hc0["hits"] - hc0["waited"]
    looked = hits + hc["misses"] - hc0["misses"]
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    print(f"{args.gguf.name}: disk tier at {hits / max(1, looked):.2%} host-cache hits: {statistics.median(ratios):.3f}x "
          f"resident decode (median of {len(ratios)} per-step ratios in lockstep, quartiles {q[0]:.3f}-{q[2]:.3f}); "
          f"tokens identical {same}; target >= 0.97x")
    if args.control:
        twin = LLM(str(args.gguf), expert_tier="ram", **common)
        decode_steps(twin, prompt, args.decode)
        ctl = []
        for _ in range(args.rounds):
            rs, ts, _ = lockstep(res, twin, prompt, args.decode)
            ctl += [a / b for a, b in zip(rs, ts)]
        print(f"control: resident / a second resident engine, same lockstep: {statistics.median(ctl):.3f}x "
              f"(median of {len(ctl)} per-step ratios)")
        twin.close()
    k = res.engine.model.hf.get("num_experts_per_tok") or 8
    ra, rb = layer_calls(res, disk, args.calls, int(k))
    print(f"MoE layer calls alone (best of {args.calls} per layer, summed over the layers, top-{k}): resident "
          f"{ra * 1e3:.3f} ms, disk tier at hits {rb * 1e3:.3f} ms: {ra / rb:.3f}x")
    if args.bookkeeping:         # last: the engines' kernels are gone after this
        import torch
        for be in (res.engine.model.experts, disk.engine.model.experts):
            be.host.run = lambda x, ids, w, out=None: out if out is not None else torch.zeros(x.shape[0], x.shape[1])
        ba, bb = layer_calls(res, disk, args.calls, int(k))
        L = disk.engine.model.experts.layout.num_layers
        print(f"bookkeeping alone (kernels no-op, best of {args.calls}): resident {ba / L * 1e6:.1f} us, disk tier "
              f"{bb / L * 1e6:.1f} us per layer call: the tier's extra {(bb - ba) / L * 1e6:.1f} us")
    res.close()
    disk.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
