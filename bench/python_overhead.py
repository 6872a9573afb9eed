"""Per-token engine overhead of decode, measured where compute is negligible.

    .venv/bin/python bench/python_overhead.py [--layers 8] [--tokens 200]

A tiny model (hidden 64, 8 experts) makes every matmul ~free, so the time per decoded token is
the engine's own work: scheduler, batch building, Python per layer, kernel launches, sampling.
Prints ms per token and µs per layer, for the resident (torch) and cpu (C kernels) backends, in
wall time and in this process's CPU time (on a shared machine the CPU time is the figure: it
does not count the time other processes held the cores)."""
from __future__ import annotations

import argparse
import tempfile
import time

import torch

from freetoken import LLM, SamplingParams
from freetoken.tiny import make_tiny


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        d = make_tiny("qwen3_moe", tmp, layers=args.layers, hidden=64, experts=8, top_k=2)
        print(f"tiny qwen3_moe, {args.layers} layers, {args.tokens} decoded tokens, {args.threads} thread(s)")
        for backend in ("resident", "cpu"):
            llm = LLM(str(d), dtype="float32", moe_backend=backend, num_threads=args.threads,
                      prefix_cache=False)
            p = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
            llm.generate([[1, 2, 3]], p)
            t, c = time.perf_counter(), time.process_time()
            llm.generate([[1, 2, 3]], p)
            dt, dc = (time.perf_counter() - t) / args.tokens, (time.process_time() - c) / args.tokens
            print(f"  {backend:9} wall {dt * 1e3:6.2f} ms/token  {dt / args.layers * 1e6:6.0f} us/layer;  "
                  f"CPU {dc * 1e3:6.2f} ms/token  {dc / args.layers * 1e6:6.0f} us/layer")
            llm.close()


if __name__ == "__main__":
    main()
