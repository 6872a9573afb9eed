"""What an engine's own kernel switches cost per step (kernels/switch_set.py): installing a set
(the caller's switches saved and the engine's written, one ft_switches call per loaded library)
and putting the caller's back, against an empty `with`, and beside a tiny model's decode step.

    PYTHONPATH=. .venv/bin/python bench/kernel_switches.py [--iters 20000] [--rounds 5] [--tokens 64]

Prints µs per install + restore (a swap, and nested in its own values: no swap), medians over
--rounds rounds alternating the cases' order, and the share of a decode step of a tiny Qwen3-MoE
(hidden 64, 4 layers, C kernels; one sequence, greedy) where the engine's step installs its set once
and its runner call nests in it."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from freetoken import LLM, SamplingParams, kernels
from freetoken.kernels.switch_set import SwitchSet
from freetoken.tiny import make_tiny

sys.path.insert(0, str(Path(__file__).parent))
from vs_llamacpp import isa_line  # noqa: E402


class Empty:
    """The `with` statement's own cost: what installing a set is measured against."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def other_set() -> SwitchSet:
    """A set unlike the process's (bf16 dots and per-256 k-quants on), the process's left as it was."""
    lib = kernels.load()
    caller = SwitchSet.now()
    lib.ft_set_bf16_dot(1)
    lib.ft_set_ggml_k256(1)
    other = SwitchSet.now()
    caller.put()
    return other


def per_with(cm, iters: int, nest=None) -> float:
    """Seconds per `with cm:` (inside `with nest:` when given)."""
    def loop():
        t = time.perf_counter()
        for _ in range(iters):
            with cm:
                pass
        return (time.perf_counter() - t) / iters
    if nest is None:
        return loop()
    with nest:
        return loop()


def decode_step_s(path: str, tokens: int) -> float:
    llm = LLM(path, dtype="bfloat16", moe_backend="cpu", num_threads=1, prefix_cache=False, speculative="off")
    engine, p = llm.engine, SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    engine.add_request("0", [1, 2, 3], p)
    engine.step()                                   # the prefill
    t, steps = time.perf_counter(), 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    dt = (time.perf_counter() - t) / steps
    llm.close()
    return dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5, help="rounds alternating the cases' order (medians)")
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    other = other_set().installed()
    cases = {"empty with": lambda: per_with(Empty(), args.iters),
             "install + restore (swap)": lambda: per_with(other, args.iters),
             "nested in its own set": lambda: per_with(other, args.iters, nest=other)}
    times: dict[str, list] = {k: [] for k in cases}
    names = list(cases)
    for r in range(args.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            times[name].append(cases[name]())
    med = {k: statistics.median(v) for k, v in times.items()}
    with tempfile.TemporaryDirectory() as tmp:
        path = str(make_tiny("qwen3_moe", f"{tmp}/moe", layers=4, hidden=64, experts=8, top_k=2, dtype="bfloat16"))
        step = statistics.median(decode_step_s(path, args.tokens) for _ in range(3))
    print(isa_line(1))
    n = len(kernels.switch_libraries())
    print(f"{n} loaded kernel librar{'y' if n == 1 else 'ies'}; load {os.getloadavg()[0]:.2f}; "
          f"medians of {args.rounds} alternating rounds of {args.iters} each")
    base = med["empty with"]
    for name in names:
        print(f"  {name:26} {med[name] * 1e6:6.2f} µs   ({(med[name] - base) * 1e6:+.2f} µs over an empty with)")
    swap = med["install + restore (swap)"] - base + med["nested in its own set"] - base
    print(f"  tiny MoE decode step (4 layers, hidden 64, 1 thread): {step * 1e3:.3f} ms; a step's install + "
          f"the runner's nested one: {swap * 1e6:.2f} µs = {swap / step:.2%} of it")


if __name__ == "__main__":
    main()
