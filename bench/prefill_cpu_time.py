"""Prefill rate per core in thread CPU time: one thread, the medium bf16 MoE, prompts of random
tokens, best of N per length (outside CI).

    PYTHONPATH=. .venv/bin/python bench/prefill_cpu_time.py [--prompt 512,2048,4096] [--rounds 2]

On a shared machine the wall-clock benches (bench/vs_llamacpp.py) measure the other processes;
the calling thread's CPU time does not count the time it waits for a core, so with one engine
thread (the pool runs in the caller) it is the prefill's own cost. Run it once per tree,
alternating, for an A/B (PYTHONPATH=<other tree>)."""
from __future__ import annotations

import argparse
import random
import time

from common import medium_checkpoint

from freetoken import LLM, SamplingParams


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt", default="512,2048,4096", help="comma list of prompt lengths")
    ap.add_argument("--rounds", type=int, default=2, help="prompts per length (best reported)")
    args = ap.parse_args()
    lens = [int(v) for v in args.prompt.split(",")]
    llm = LLM(str(medium_checkpoint()), num_threads=1, max_model_len=max(lens) + 64, dtype="bfloat16")
    once = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    llm.generate([list(range(5, 37))], once)        # warm-up: calibration, kernels built
    rng = random.Random(1)
    cells = []
    for n in lens:
        best = 0.0
        for _ in range(args.rounds):
            prompt = [rng.randrange(100, 8000) for _ in range(n)]
            t = time.thread_time()
            llm.generate([prompt], once)
            best = max(best, n / (time.thread_time() - t))
        cells.append(f"{n} tokens {best:.0f} tok/s")
    print("prefill per core (thread CPU time, 1 thread, best of "
          f"{args.rounds}): " + ", ".join(cells), flush=True)
    llm.close()


if __name__ == "__main__":
    main()
