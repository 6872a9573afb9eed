"""The disk tier with the expert pool at twice the memory it may use: decode tok/s of
FreeToken's disk tier (host cache = half the pool, the file's page cache dropped first so
the disk is really read) against the fully resident pool, and against llama.cpp's mmap on the
same GGUF (if `llama_cpp` is importable), optionally the disk tier and llama.cpp under one
cgroup-v1 memory limit (`--cgroup-mib`; the resident reference runs outside it). Each engine runs alone in its own process, rounds alternate.
The disk tier must give the resident run's tokens exactly (checked, printed).

  PYTHONPATH=. python bench/disk_tier.py [--gguf FILE] [--decode 32] [--rounds 2] [--cgroup-mib M]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_GGUF = Path.home() / ".cache" / "freetoken" / "bench" / "qwen3-moe-medium-q4_k_m.gguf"
CGROUP = Path("/sys/fs/cgroup/memory")

FT = textwrap.dedent("""
    import json, os, sys, time
    from freetoken import LLM, SamplingParams
    path, mode, n_decode, threads, cache_gib = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    prompt = json.loads(sys.stdin.read())
    fd = os.open(path, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
    opts = dict(host_cache_gib=cache_gib) if mode == "disk" else dict(expert_tier="ram")
    llm = LLM(path, dtype="bfloat16", num_threads=threads, max_model_len=1024, prefix_cache=False, **opts)
    eng = llm.engine
    eng.add_request("r", prompt, SamplingParams(max_tokens=n_decode, temperature=0.0, ignore_eos=True))
    toks, times = [], []
    t0 = time.perf_counter()
    while eng.has_unfinished():
        for out in eng.step():
            toks += out.new_token_ids
            times.append(time.perf_counter())
    st = llm.expert_stats()
    rss = int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM"))) * 1024
    print(json.dumps({"prefill": len(prompt) / (times[0] - t0), "decode": (len(times) - 1) / (times[-1] - times[0]),
                      "tokens": toks, "hwm": rss, "host_cache": st.get("host_cache"), "disk": st.get("disk")}))
""")


def _in_cgroup(name: str | None):
    if not name:
        return None
    tasks = CGROUP / name / "tasks"
    return lambda: tasks.write_text(str(os.getpid()))


def run(script: str, args: list[str], stdin: str, cgroup: str | None, extra_path: str = "") -> dict:
    env = {**os.environ, "PYTHONPATH": f"{HERE.parent}{os.pathsep}{extra_path}"}
    p = subprocess.run([sys.executable, "-c", script, *args], input=stdin, capture_output=True, text=True,
                       env=env, preexec_fn=_in_cgroup(cgroup))
    if p.returncode:
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache-share", type=float, default=0.5, help="host cache as a share of the pool")
    ap.add_argument("--cgroup-mib", type=int, default=None,
                    help="run every engine under a cgroup-v1 memory limit of this many MiB")
    ap.add_argument("--no-llamacpp", action="store_true")
    args = ap.parse_args()

    import random
    from freetoken.models.disk_layout import gguf_layout
    from freetoken.weights.gguf import GgufFile
    sys.path.insert(0, str(HERE))
    from vs_llamacpp import LLAMA_RUN as LLAMA, WARMUP, isa_line
    layout = gguf_layout(GgufFile(args.gguf))
    pool_gib = layout.nbytes / 2**30
    cache_gib = pool_gib * args.cache_share
    rng = random.Random(0)
    vocab = GgufFile(args.gguf).config["vocab_size"]
    cg = None
    if args.cgroup_mib:
        cg = f"freetoken-disk-tier-{os.getpid()}"
        (CGROUP / cg).mkdir()
        (CGROUP / cg / "memory.limit_in_bytes").write_text(str(args.cgroup_mib * 2**20))
    try:
        import importlib.util
        have_ll = not args.no_llamacpp and importlib.util.find_spec("llama_cpp") is not None
        print(isa_line(args.threads))
        print(f"model {args.gguf.name}: expert pool {pool_gib:.2f} GiB, host cache {cache_gib:.2f} GiB "
              f"({args.cache_share:.0%}), cgroup {args.cgroup_mib or 'none'} MiB, {args.prompt_tokens}-token prompt, "
              f"{args.decode} decoded, {args.threads} threads")
        rows: dict[str, list[dict]] = {"resident": [], "disk": [], "llama.cpp mmap": []}
        for r in range(args.rounds):
            prompt = [rng.randrange(10, vocab) for _ in range(args.prompt_tokens)]   # fresh each round
            stdin = json.dumps(prompt)
            base = [str(args.gguf), "", str(args.decode), str(args.threads), f"{cache_gib:.4f}"]
            for mode in ("resident", "disk"):
                a = list(base)
                a[1] = mode        # the resident reference (its tokens) runs outside the limit: it cannot fit
                rows[mode].append(run(FT, a, stdin, cg if mode == "disk" else None))
            if have_ll:
                drop = os.open(args.gguf, os.O_RDONLY)
                os.posix_fadvise(drop, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(drop)
                rows["llama.cpp mmap"].append(run(LLAMA, [str(args.gguf), str(args.threads), str(args.decode)],
                                                  json.dumps([WARMUP, [prompt]]), cg))
            res, disk = rows["resident"][-1], rows["disk"][-1]
            same = "tokens" in res and res.get("tokens") == disk.get("tokens")
            ll = rows["llama.cpp mmap"][-1] if have_ll else {}
            print(f"round {r}: resident {res.get('decode', 0):.2f} tok/s, disk tier {disk.get('decode', 0):.2f} "
                  f"tok/s ({disk.get('decode', 0) / max(res.get('decode', 1e-9), 1e-9):.2f}x), llama.cpp mmap "
                  f"{ll.get('decode', 0):.2f} tok/s; disk vs llama.cpp "
                  f"{disk.get('decode', 0) / max(ll.get('decode', 1e-9), 1e-9):.2f}x; tokens identical to resident: "
                  f"{same}; host-cache hit rate {(disk.get('host_cache') or {}).get('hit_rate', 0):.1%}, "
                  f"{(disk.get('disk') or {}).get('bytes_read', 0) / 1e9:.2f} GB read; peak RSS resident "
                  f"{res.get('hwm', 0) / 2**30:.2f} GiB, disk {disk.get('hwm', 0) / 2**30:.2f} GiB"
                  + "".join(f"; {k} error: {v['error']}" for k, v in (("resident", res), ("disk", disk),
                                                                       ("llama.cpp", ll)) if "error" in v))
        med = lambda k: sorted(x.get("decode", 0) for x in rows[k])[len(rows[k]) // 2] if rows[k] else 0  # noqa: E731
        print(f"median decode tok/s: resident {med('resident'):.2f}, disk tier {med('disk'):.2f}, "
              f"llama.cpp mmap {med('llama.cpp mmap'):.2f}")
    finally:
        if cg:
            (CGROUP / cg).rmdir()


if __name__ == "__main__":
    main()
