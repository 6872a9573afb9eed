"""The verify cost curve of the dense bench model in CPU time: one sequence's steps with k random
drafts forced (every draft rejected, so each step verifies k + 1 positions) after a prompt of
each context length, one thread, `time.thread_time` around each engine step (waiting for a core
on a shared machine does not count). Prints per context the median step ms at k = 0 and each k's
ratio to it: the `--cost` curve of `bench/spec_bounds.py`.

    PYTHONPATH=. .venv/bin/python bench/verify_cost.py [--contexts 256,1200,1600] [--ks 0,1,2,4,8] [--steps 16]
                                                     [--decode-attention auto|amx|fp32]

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="256,1200,1600")
    ap.add_argument("--ks", default="0,1,2,4,8")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--decode-attention", default="auto", choices=("auto", "amx", "fp32"),
                    help="force decode attention over the bf16 cache onto AMX tiles or fp32 FMAs (auto: calibrated)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from freetoken import LLM
    ks = [int(k) for k in args.ks.split(",")]
    llm = LLM(str(medium_checkpoint("qwen3", "qwen3-dense-medium", **MEDIUM_DENSE)), speculative="auto",
              num_threads=1, max_model_len=4096, spec_max_draft=max(ks), decode_attention=args.decode_attention)
    print(isa_line(1))
    print(f"dense bench model, 1 thread, CPU ms of a step (median of {args.steps}), k random drafts forced")
    print(f"{'context':>8}" + "".join(f"{'k=' + str(k):>10}" for k in ks) + "   --cost (k = 0..max, linear between)")
    for ctx in map(int, args.contexts.split(",")):
        ms = {k: statistics.median(step_times(llm, k, ctx, args.steps)) * 1e3 for k in ks}
        ratio = {k: ms[k] / ms[ks[0]] for k in ks}
        cost = [ratio[ks[0]]]
        for k in range(ks[0] + 1, max(ks) + 1):        # linear between the measured k
            lo, hi = max(x for x in ks if x <= k), min(x for x in ks if x >= k)
            cost.append(ratio[lo] if lo == hi else ratio[lo] + (ratio[hi] - ratio[lo]) * (k - lo) / (hi - lo))
        print(f"{ctx:8}" + "".join(f"{ms[k]:10.2f}" if k == ks[0] else f"{ratio[k]:9.2f}x" for k in ks)
              + "   " + ",".join(f"{c:.3f}" for c in cost), flush=True)


if __name__ == "__main__":
    main()
