"""How often a cached kernel calibration (kernels/choices.py) picks each way, quiet and under a
synthetic load on the same cores, and how long one calibration takes.

    PYTHONPATH=. .venv/bin/python bench/calibration_load.py [--what bf16dot] [--threads 2]
                                    [--runs 10] [--loads quiet,cpu2,cpu4,bw2]

Each run calls the choice function as an engine start does, with a fresh cache dir (so it
measures), and prints its pick, the measured speed ratio and its seconds. Loads: "quiet" (none
added), "cpuN" (N processes spinning `while 1: pass`), "bwN" (N processes copying 256 MiB arrays,
a memory-bandwidth hog). What: bf16dot (choices.bf16_dot_choice), gemm (prefill_gemm_choice),
k256 (ggml_k256_choice), int8zmm (int8_zmm_choice)."""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from freetoken.kernels import choices, cpu_kernels
from freetoken.platform import cpu_flags

HOGS = {"cpu": "while 1: pass",
        "bw": "import torch\na, b = torch.empty(1 << 26), torch.empty(1 << 26)\nwhile 1: a.copy_(b)"}


def start_load(load: str) -> list[subprocess.Popen]:
    if load == "quiet":
        return []
    kind, n = load.rstrip("0123456789"), int(load[len(load.rstrip("0123456789")):])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return [subprocess.Popen([sys.executable, "-c", HOGS[kind]], env=env) for _ in range(n)]


def cached_seconds(cache: str) -> dict:
    """The seconds of the one calibration cached in `cache` (the steady estimate of its rounds
    where the entry has rounds, else the entry as it is: a tree before issue 38)."""
    (path,) = Path(cache).glob("*-choice-*.json")
    e = json.loads(path.read_text())
    if "rounds" not in e:
        return e
    from freetoken.kernels.interleaved import steady_seconds
    return steady_seconds(e["rounds"])


def one(what: str, threads: int, cache: str) -> tuple[str, float, float]:
    """(the pick, the speed ratio that decided it (the default way's seconds / the other way's),
    the same at one row for bf16dot (its second condition), else nan)."""
    flags = cpu_flags()
    if what == "bf16dot":
        on, t = choices.bf16_dot_choice("auto", torch.bfloat16, kernels=True, flags=flags, threads=threads, cache=cache)
        return ("bf16" if on else "fp32"), t["fp32"] / t["bf16"], t["fp32-1"] / t["bf16-1"]
    if what == "gemm":
        dense, expert, t = choices.prefill_gemm_choice("auto", torch.float32, kernels=True, flags=flags,
                                                       threads=threads, cache=cache)
        key = {"float32": "fp32", "bfloat16": "bf16"}.get(dense, dense)
        return f"{dense}/{expert}", t["fp32"] / t[key], float("nan")
    if what == "k256":
        on = choices.ggml_k256_choice("auto", "native", threads, cache=cache)
        t = cached_seconds(cache)
        return ("q8k" if on else "q8"), t["q8"] / t["q8k"], float("nan")
    if what == "int8zmm":
        on = choices.int8_zmm_choice(cpu_kernels(), "native", threads, cache=cache)
        t = cached_seconds(cache)
        return ("zmm" if on else "ymm"), t["ymm"] / t["zmm"], float("nan")
    raise SystemExit(f"--what: {what!r}; expected one of bf16dot|gemm|k256|int8zmm")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--what", default="bf16dot")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--loads", default="quiet,cpu2,cpu4,bw2")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{args.what}, {args.threads} threads, {args.runs} runs per load; loadavg before "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    for load in args.loads.split(","):
        procs = start_load(load)
        try:
            time.sleep(1.0 if procs else 0.0)
            picks, ratios, ones, secs = collections.Counter(), [], [], []
            for _ in range(args.runs):
                with tempfile.TemporaryDirectory() as cache:
                    t0 = time.perf_counter()
                    pick, ratio, at1 = one(args.what, args.threads, cache)
                    secs.append(time.perf_counter() - t0)
                picks[pick] += 1
                ratios.append(ratio)
                ones.append(at1)
            la = os.getloadavg()[0]
        finally:
            for p in procs:
                p.kill()
                p.wait()
        print(f"{load:6}  load {la:5.2f}  picks {dict(picks)}  ratio median {statistics.median(ratios):.2f} "
              f"(min {min(ratios):.2f}, max {max(ratios):.2f})  1-row {statistics.median(ones):.2f} "
              f"(min {min(ones):.2f})  seconds median {statistics.median(secs):.2f} "
              f"(max {max(secs):.2f})", flush=True)


if __name__ == "__main__":
    main()
