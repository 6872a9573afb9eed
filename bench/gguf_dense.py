"""GGUF dense layers kept in their llama.cpp quantization vs dequantized at load, same file,
same run: resident memory after load and decode tok/s.

    PYTHONPATH=. .venv/bin/python bench/gguf_dense.py [--gguf FILE] [--threads 2] [--decode 32] [--rounds 2]

Each configuration loads in its own subprocess (so its memory is its own), alternating
packed / dequantized `--rounds` times; prints RSS (anonymous and file-backed) and the decode
ratio packed / dequantized (the median of the rounds); decode tok/s = generated tokens / the
time of a generate call on a 4-token prompt; "per CPU second" divides by the process's CPU time
instead (with --threads 1 the work done, less sensitive to a shared machine's load)."""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

DEFAULT = Path.home() / ".cache" / "freetoken" / "bench" / "qwen3-moe-medium-q4_k_m.gguf"


def rss() -> dict:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "RssAnon", "RssFile"):
            out[k] = int(v.split()[0]) * 1024
    return out


def child(gguf: str, dense_format: str | None, threads: int, n_decode: int) -> dict:
    import gc

    import torch

    from freetoken import LLM, SamplingParams
    opts = {"dense_format": dense_format} if dense_format else {}
    llm = LLM(gguf, dtype="bfloat16", num_threads=threads, moe_backend="cpu", max_model_len=1024,
              max_num_seqs=1, kv_cache_gib=0.25, prefix_cache=False, **opts)
    gc.collect()
    mem = rss()
    prompt = torch.randint(100, 8000, (4,), generator=torch.Generator().manual_seed(0)).tolist()
    greedy = dict(temperature=0.0, ignore_eos=True)
    llm.generate([prompt], SamplingParams(max_tokens=4, **greedy))             # warm-up
    t0, c0 = time.perf_counter(), time.process_time()     # a 4-token prompt: the time is the decode steps
    out = llm.generate([prompt], SamplingParams(max_tokens=n_decode, **greedy))
    t1, c1 = time.perf_counter(), time.process_time()
    return {**mem, "decode_tok_s": n_decode / (t1 - t0), "cpu_tok_s": n_decode / (c1 - c0), "tokens": out[0].token_ids}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=str(DEFAULT))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", default=None)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.gguf, args.child or None, args.threads, args.decode)))
        return
    runs = {"packed": [], "float": []}
    for _ in range(args.rounds):
        for name, fmt in (("packed", ""), ("float", "float")):
            r = subprocess.run([sys.executable, __file__, "--gguf", args.gguf, "--threads", str(args.threads),
                                "--decode", str(args.decode), "--child", fmt], capture_output=True, text=True)
            if r.returncode:
                sys.exit(r.stderr[-3000:])
            runs[name].append(json.loads(r.stdout.strip().splitlines()[-1]))
    gib = 1 << 30
    for name, rs in runs.items():
        tok = statistics.median(r["decode_tok_s"] for r in rs)
        each = ", ".join(f"{r['decode_tok_s']:.1f}" for r in rs)
        cpu = statistics.median(r["cpu_tok_s"] for r in rs)
        print(f"{name:7s} RSS {rs[0]['VmRSS'] / gib:.2f} GiB (anon {rs[0]['RssAnon'] / gib:.2f}, "
              f"file {rs[0]['RssFile'] / gib:.2f}), decode {tok:.1f} tok/s "
              f"(rounds: {each}); per CPU second {cpu:.1f} tok/s")
    ratio = statistics.median(r["decode_tok_s"] for r in runs["packed"]) / statistics.median(
        r["decode_tok_s"] for r in runs["float"])
    cpu_ratio = statistics.median(r["cpu_tok_s"] for r in runs["packed"]) / statistics.median(
        r["cpu_tok_s"] for r in runs["float"])
    print(f"{Path(args.gguf).name}, {args.threads} threads, decode {args.decode}: packed / dequantized dense "
          f"decode {ratio:.2f}x (per CPU second {cpu_ratio:.2f}x), RSS {runs['packed'][0]['VmRSS'] / runs['float'][0]['VmRSS']:.2f}x")


if __name__ == "__main__":
    main()
