"""Concurrent decode streams on the CPU: aggregate decode tok/s with 1, 2, 4, 8 sequences decoding
together (one batched step: dense GEMVs over all S tokens, routed experts grouped so each distinct
expert's weights are read once per step), with the bf16 weights x fp32 activations tiles vs the
vdpbf16ps tiles, side by side in alternating rounds on one loaded model.

    PYTHONPATH=. .venv/bin/python bench/concurrent_streams.py [--threads 2] [--streams 1,2,4,8]
                                                              [--prompt 256] [--decode 32] [--rounds 2]

Prints per S: aggregate decode tok/s of each mode, the ratio to S=1 in that mode, the ratio
bf16-dot/fp32."""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import medium_checkpoint  # noqa: E402
from vs_llamacpp import isa_line  # noqa: E402


def decode_rate(llm, prompts: list[list[int]], n_decode: int) -> float:
    """Aggregate decode tok/s from the step where every sequence has its first token."""
    from freetoken import SamplingParams
    engine = llm.engine
    for i, p in enumerate(prompts):
        engine.add_request(f"r{time.monotonic_ns()}-{i}", p, SamplingParams(max_tokens=n_decode + 1, temperature=0.0,
                                                                             ignore_eos=True))
    t_first, counted, seen = None, 0, set()
    while engine.has_unfinished():
        outs = engine.step()
        for o in outs:
            if t_first is not None:
                counted += len(o.new_token_ids)
            seen.add(o.request_id)
        if t_first is None and len(seen) == len(prompts):
            t_first = time.perf_counter()
    return counted / (time.perf_counter() - t_first)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(isa_line(args.threads), flush=True)
    from freetoken import LLM
    from freetoken.kernels import cpu_kernels
    model = medium_checkpoint()
    streams = [int(s) for s in args.streams.split(",")]
    g = torch.Generator().manual_seed(0)
    llm = LLM(str(model), dtype="bfloat16", num_threads=args.threads, max_model_len=args.prompt + args.decode + 64,
              max_num_seqs=max(streams), prefix_cache=False)
    lib = cpu_kernels()
    modes = {"fp32 act": 0, "bf16 dot": 1}
    available = lib.ft_set_bf16_dot(1) == 2
    if not available:
        modes = {"fp32 act": 0}
    chosen = llm.engine.runner.model.choices.bf16_dot
    rates = {(m, s): [] for m in modes for s in streams}
    for r in range(args.rounds):
        for s in streams:
            prompts = [torch.randint(100, 8000, (args.prompt,), generator=g).tolist() for _ in range(s)]
            for m in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
                lib.ft_set_bf16_dot(modes[m])
                rates[(m, s)].append(decode_rate(llm, prompts, args.decode))
            print(f"round {r}: S={s} " + ", ".join(f"{m} {rates[(m, s)][-1]:.1f}" for m in modes), flush=True)
    lib.ft_set_bf16_dot(int(chosen))
    llm.close()
    print(f"\n{args.threads} threads, prompt {args.prompt}, decode {args.decode} per sequence, median of "
          f"{args.rounds} alternating rounds; auto chose {'bf16 dot' if chosen else 'fp32 act'} here")
    print(f"{'S':>3}" + "".join(f"{m + ' tok/s':>16}{'vs S=1':>8}" for m in modes)
          + (f"{'dot/fp32':>10}" if len(modes) > 1 else ""))
    for s in streams:
        med = {m: statistics.median(rates[(m, s)]) for m in modes}
        base = {m: statistics.median(rates[(m, streams[0])]) for m in modes}
        line = f"{s:3}" + "".join(f"{med[m]:16.1f}{med[m] / base[m]:7.2f}x" for m in modes)
        if len(modes) > 1:
            line += f"{med['bf16 dot'] / med['fp32 act']:9.2f}x"
        print(line)


if __name__ == "__main__":
    main()
