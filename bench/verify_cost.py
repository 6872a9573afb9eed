"""The verify cost curve of the dense bench model in CPU time: one sequence's steps with k random
drafts forced (every draft rejected, so each step verifies k + 1 positions) after a prompt of
each context length, one thread, `time.thread_time` around each engine step (waiting for a core
on a shared machine does not count). Prints per context the median step ms at k = 0 and each k's
ratio to it: the `--cost` curve of `bench/spec_bounds.py`.

    PYTHONPATH=. .venv/bin/python bench/verify_cost.py [--contexts 256,1200,1600] [--ks 0,1,2,4,8] [--steps 16]
                                                     [--decode-attention auto|amx|fp32] [--interleave]
                                                     [--bf16-dot auto|on|off]

--interleave: one request per context, its steps taking each k in turn (k = 0, 1, 2, ... then
again), so a shared machine's load falls on every k alike; without it each k is its own request.

The model is `bench/speculative.py --model dense` (4 layers, hidden 2048, 32 query / 4 KV heads)."""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import fresh_prompts, medium_checkpoint  # noqa: E402
from speculative import MEDIUM_DENSE, FixedDrafter  # noqa: E402
from vs_llamacpp import isa_line  # noqa: E402


def step_times(llm, k: int, context: int, steps: int) -> list[float]:
    """CPU seconds of each decode step of one request (its prefill step left out)."""
    from freetoken import SamplingParams
    engine, spec = llm.engine, llm.engine.spec
    spec.drafters, spec.priced = ({"fixed": FixedDrafter(k, engine.vocab_size)} if k else {}), False
    prompt = fresh_prompts(1, context, seed=77, vocab=(100, engine.vocab_size - 1))[0]
    engine.add_request(f"cost{k}-{context}", prompt, SamplingParams(max_tokens=steps + 1, temperature=0.0,
                                                                     ignore_eos=True))
    out = []
    while engine.has_unfinished():
        t = time.thread_time()
        engine.step()
        out.append(time.thread_time() - t)
    return out[1:]


def interleaved_times(llm, ks: list[int], context: int, steps: int) -> dict[int, list[float]]:
    """CPU seconds of each k's steps, one request whose steps cycle through ks (about the same
    keys for every k: each step adds one token, its rejected drafts' rows are not read again)."""
    from freetoken import SamplingParams
    engine, spec = llm.engine, llm.engine.spec
    spec.priced = False
    prompt = fresh_prompts(1, context, seed=77, vocab=(100, engine.vocab_size - 1))[0]
    rid = f"cost-cycle-{context}"        # room for every step (a random draft is right 1 in 8192)
    engine.add_request(rid, prompt, SamplingParams(max_tokens=2 * steps * (sum(ks) + len(ks)) + 2,
                                                   temperature=0.0, ignore_eos=True))
    spec.drafters = {}
    engine.step()                   # the prefill
    out = {k: [] for k in ks}
    for _ in range(steps):
        for k in ks:
            spec.drafters = {"fixed": FixedDrafter(k, engine.vocab_size)} if k else {}
            t = time.thread_time()
            engine.step()
            out[k].append(time.thread_time() - t)
    engine.abort_request(rid)
    while engine.has_unfinished():
        engine.step()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="256,1200,1600")
    ap.add_argument("--ks", default="0,1,2,4,8")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--decode-attention", default="auto", choices=("auto", "amx", "fp32"),
                    help="force decode attention over the bf16 cache onto AMX tiles or fp32 FMAs (auto: calibrated)")
    ap.add_argument("--bf16-dot", default="auto", choices=("auto", "on", "off"),
                    help="bf16 weights x bf16-rounded activations (vdpbf16ps) in the kernels: calibrated, or forced")
    ap.add_argument("--interleave", action="store_true", help="each request's steps cycle through the ks")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from freetoken import LLM
    ks = [int(k) for k in args.ks.split(",")]
    llm = LLM(str(medium_checkpoint("qwen3", "qwen3-dense-medium", **MEDIUM_DENSE)), speculative="auto",
              num_threads=1, max_model_len=4096, spec_max_draft=max(ks), decode_attention=args.decode_attention,
              bf16_dot=args.bf16_dot)
    print(isa_line(1))
    print(f"dense bench model, 1 thread, CPU ms of a step (median of {args.steps}), k random drafts forced")
    print(f"{'context':>8}" + "".join(f"{'k=' + str(k):>10}" for k in ks) + "   --cost (k = 0..max, linear between)")
    for ctx in map(int, args.contexts.split(",")):
        times = (interleaved_times(llm, ks, ctx, args.steps) if args.interleave else
                 {k: step_times(llm, k, ctx, args.steps) for k in ks})
        ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        ratio = {k: ms[k] / ms[ks[0]] for k in ks}
        cost = [ratio[ks[0]]]
        for k in range(ks[0] + 1, max(ks) + 1):        # linear between the measured k
            lo, hi = max(x for x in ks if x <= k), min(x for x in ks if x >= k)
            cost.append(ratio[lo] if lo == hi else ratio[lo] + (ratio[hi] - ratio[lo]) * (k - lo) / (hi - lo))
        print(f"{ctx:8}" + "".join(f"{ms[k]:10.2f}" if k == ks[0] else f"{ratio[k]:9.2f}x" for k in ks)
              + "   " + ",".join(f"{c:.3f}" for c in cost), flush=True)


if __name__ == "__main__":
    main()
