"""Where the disk tier's CPU goes at a small host cache: per decoded token, the whole process's
CPU and the I/O threads' CPU (the `freetoken-disk` read pool: O_DIRECT syscalls, bounce copies,
the xxh3 of every read), read from each thread's own clock (/proc/self/task/<tid>/schedstat, ns),
with the bytes read, the time callers blocked on reads, the reads still in flight when their layer
came (`waited`) and the layer calls that handed slots to the next layer's reads mid-call
(`handoffs`, experts/disk/handoff.py). CPU time, unlike tok/s, stays
readable on a shared, loaded machine. In-process, the engine that `PYTHONPATH` names, so one copy
of this script compares two trees (run it alternately with each tree's `PYTHONPATH`):

  PYTHONPATH=. python bench/disk_io_cpu.py --synthetic-layers 4 --cache-share 0.05 --rounds 3
  PYTHONPATH=/tmp/ft-base python bench/disk_io_cpu.py --synthetic-layers 4 --cache-share 0.05 --rounds 3

Each round is a fresh engine on a fresh random prompt (seeded), the file's page cache dropped
first; medians over the rounds at the end.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import threading
import time
from pathlib import Path


def thread_ns() -> dict[str, int]:
    """CPU ns so far of the I/O threads ("io") and of all other Python-visible threads."""
    out = {"io": 0, "other": 0}
    for th in threading.enumerate():
        try:
            with open(f"/proc/self/task/{th.native_id}/schedstat") as f:
                ns = int(f.read().split()[0])
        except (OSError, TypeError, ValueError):
            continue
        out["io" if th.name.startswith("freetoken-disk") else "other"] += ns
    return out


def one_round(path: Path, cache_gib: float, prompt: list[int], decode: int, threads: int) -> dict:
    from freetoken import LLM, SamplingParams
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    llm = LLM(str(path), dtype="bfloat16", num_threads=threads, max_model_len=1024, prefix_cache=False,
              host_cache_gib=cache_gib)
    try:
        eng = llm.engine
        eng.add_request("r", prompt, SamplingParams(max_tokens=decode, temperature=0.0, ignore_eos=True))
        n = steps = 0
        while eng.has_unfinished():
            for out in eng.step():
                n += len(out.new_token_ids)
                steps += 1
                if steps == 1:           # decode only: from the first token on
                    t0, c0, s0 = time.perf_counter(), time.process_time(), thread_ns()
                    d0, h0 = llm.expert_stats()["disk"], llm.expert_stats()["host_cache"]
        t1, c1, s1 = time.perf_counter(), time.process_time(), thread_ns()
        d1, h1 = llm.expert_stats()["disk"], llm.expert_stats()["host_cache"]
    finally:
        llm.close()
    tok = max(1, n - 1)
    return {"tok_s": tok / (t1 - t0), "steps_s": (steps - 1) / (t1 - t0), "proc_ms": (c1 - c0) / tok * 1e3,
            "io_ms": (s1["io"] - s0["io"]) / tok / 1e6, "mb": (d1["bytes_read"] - d0["bytes_read"]) / tok / 1e6,
            "blocked_ms": (d1["read_s"] - d0["read_s"]) / tok * 1e3, "tokens_per_step": tok / max(1, steps - 1),
            # reads still in flight when their layer call came (host cache `waited`), and the calls that
            # handed their slots to the next layer's reads mid-call (experts/disk/handoff.py; 0 where absent)
            "waited": (h1["waited"] - h0["waited"]) / tok, "handoffs": (d1.get("handoffs", 0) - d0.get("handoffs", 0)) / tok}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, default=None)
    ap.add_argument("--synthetic-layers", type=int, default=4,
                    help="the real-shaped synthetic Q4_K_M GGUF of this many layers (bench/real_size.py; built once in --dir)")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/freetoken-real-size"))
    ap.add_argument("--cache-share", type=float, default=0.05, help="host cache as a share of the expert pool")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    path = args.gguf
    if path is None:
        import sys
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from real_size import build
        args.dir.mkdir(parents=True, exist_ok=True)
        path = args.dir / f"qwen3-30b-a3b-shape-{args.synthetic_layers}L-q4_k_m.gguf"
        build(path, args.synthetic_layers)
    from freetoken.loading.disk_layout import gguf_layout
    from freetoken.weights.gguf.reader import GgufFile
    ck = GgufFile(path)
    cache_gib = gguf_layout(ck).nbytes / 2**30 * args.cache_share
    vocab = ck.config["vocab_size"]
    import freetoken
    print(f"engine {Path(freetoken.__file__).parent}; {path.name}, host cache {cache_gib:.3f} GiB "
          f"({args.cache_share:.0%}), {args.prompt_tokens}-token prompts, {args.decode} decoded, {args.threads} threads")
    rows = []
    for r in range(args.rounds):
        rng = random.Random(r)
        prompt = [rng.randrange(10, vocab) for _ in range(args.prompt_tokens)]
        row = one_round(path, cache_gib, prompt, args.decode, args.threads)
        rows.append(row)
        print(f"round {r} (load {os.getloadavg()[0]:.1f}): " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()))
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print("median: decode %.2f tok/s; per decoded token: I/O threads' CPU %.2f ms, process CPU %.1f ms, %.1f MB read, "
          "%.2f ms blocked on reads, %.2f reads waited for, %.2f handoffs" % (
              med["tok_s"], med["io_ms"], med["proc_ms"], med["mb"], med["blocked_ms"], med["waited"], med["handoffs"]))


if __name__ == "__main__":
    main()
