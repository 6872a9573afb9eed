"""Real shapes, side by side (outside CI): a random-weight GGUF with the exact shapes and
Q4_K_M types of Qwen3-30B-A3B (weights/gguf/synthetic.py; 48 layers = 17.3 GB), then

  load     FreeToken's load peak (VmHWM) against its settled resident size, and the expert
           pool against the file's expert bytes (mixed Q4_K/Q6_K types);
  convert  `freetoken convert` of the GGUF: its peak above the process baseline, FTW size /
           GGUF size, the FTW file's load peak, logits of GGUF and FTW compared bit for bit;
  speed    prefill and decode tok/s at each prompt length against llama.cpp (llama-cpp-python)
           on the same file, each engine alone, rounds alternating (bench/vs_llamacpp.py);
  spread   the routing's spread over each layer's experts beside the real Qwen3-30B-A3B
           trace's (bench/routing_spread.py; the weights' gains are chosen for it)
  disk     the disk tier with a host cache of half the pool against llama.cpp's mmap, both
           under one cgroup-v1 memory limit (bench/disk_tier.py).

Every engine runs in a process of its own (one model in memory at a time). The full size
needs ~23 GiB free while llama.cpp runs (its repacked copy plus the mapped file) and 35 GB of
disk (GGUF + FTW); `--layers N` scales the layer count (every other shape stays real).

  PYTHONPATH=. python bench/real_size.py [--layers 48] [--dir DIR] [--steps load,convert,speed,spread,disk]
                                         [--prompt 512,4096] [--decode 32] [--rounds 1] [--keep]
  PYTHONPATH=. python bench/real_size.py --steps spread --keep     # build once, check its routing
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

STATUS = textwrap.dedent("""
    def status():
        out = {}
        for line in open("/proc/self/status"):
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
        return out
""")

# load (or convert, then nothing) in a fresh process; report base / peak / settled bytes
CHILD = STATUS + textwrap.dedent("""
    import gc, hashlib, json, sys, time
    import torch
    from freetoken import LLM
    from freetoken.loading.convert import convert
    what, path = sys.argv[1], sys.argv[2]
    base = status()["VmRSS"]
    t = time.perf_counter()
    out = {}
    if what == "convert":
        convert(path, sys.argv[3])
    else:
        llm = LLM(path, dtype="bfloat16", max_model_len=256, kv_cache_gib=0.01, max_num_seqs=1, expert_tier="ram")
        pool = llm.engine.model.pool
        gc.collect()
        ids = [(37 * i) % 5000 + 100 for i in range(16)]
        out = {"pool": pool.nbytes if pool is not None else 0,
               "logits": hashlib.sha256(llm.score(ids).float().numpy().tobytes()).hexdigest()}
    s = status()
    print(json.dumps({**out, "seconds": time.perf_counter() - t, "base": base, "peak": s["VmHWM"], "settled": s["VmRSS"]}))
""")


def child(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, env=env)
    if p.returncode:
        raise RuntimeError(f"{args[0]} {args[1]} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def build(path: Path, layers: int, with_ftw: bool = True) -> None:
    from freetoken.weights.gguf import synthetic as sg
    if path.exists():
        return
    s = sg.Shape(layers=layers)
    plan = sg.tensor_plan(s, 151936)
    need = sum(_nbytes(shape, ty) for _, shape, ty in plan)
    free = shutil.disk_usage(path.parent).free
    copies = 2.1 if with_ftw else 1.05      # the GGUF and its FTW copy
    if free < copies * need:
        sys.exit(f"{path.parent}: {gib(free)} free, the GGUF{' and its FTW' if with_ftw else ''} need {gib(copies * need)}; "
                 "use --dir elsewhere or fewer --layers")
    t = time.perf_counter()
    tmp = path.with_name(path.name + ".partial")
    sg.write(tmp, s)
    tmp.rename(path)
    print(f"built {path.name}: {gib(path.stat().st_size)} in {time.perf_counter() - t:.0f} s", flush=True)


def _nbytes(shape, ty) -> int:
    from freetoken.weights.gguf import synthetic as sg
    block, size = sg._block(ty)
    n = 1
    for d in shape[:-1]:
        n *= d
    return n * (shape[-1] // block) * size


def file_expert_bytes(path: Path) -> int:
    from freetoken.weights.gguf.reader import GgufFile
    ck = GgufFile(path)
    return sum(t.nbytes for n, (_, t) in ck.tensors_by_name.items() if "_exps." in n)


def step_load(path: Path) -> dict:
    r = child("load", str(path))
    w_peak, w_settled = r["peak"] - r["base"], r["settled"] - r["base"]
    ex = file_expert_bytes(path)
    print(f"load {path.name}: {r['seconds']:.1f} s, peak {gib(r['peak'])}, settled {gib(r['settled'])} "
          f"(peak/settled {r['peak'] / r['settled']:.3f}x; the load's own: {gib(w_peak)} / {gib(w_settled)} = "
          f"{w_peak / w_settled:.3f}x); expert pool {gib(r['pool'])} for {gib(ex)} of expert bytes in the file "
          f"({r['pool'] / ex:.3f}x)", flush=True)
    return r


def step_convert(path: Path, ftw: Path, gguf_load: dict | None) -> None:
    r = child("convert", str(path), str(ftw))
    ratio = ftw.stat().st_size / path.stat().st_size
    print(f"convert -> {ftw.name}: {r['seconds']:.1f} s, peak {gib(r['peak'] - r['base'])} above the process "
          f"baseline ({gib(r['base'])}); FTW {gib(ftw.stat().st_size)} = {ratio:.4f}x the GGUF", flush=True)
    f = child("load", str(ftw))
    same = gguf_load is not None and f["logits"] == gguf_load["logits"]
    print(f"load {ftw.name}: {f['seconds']:.1f} s, peak {gib(f['peak'])}, settled {gib(f['settled'])} "
          f"(peak/settled {f['peak'] / f['settled']:.3f}x); logits bit for bit the GGUF's: "
          f"{same if gguf_load is not None else 'not compared (run the load step too)'}", flush=True)


def step_speed(path: Path, prompts: list[int], decode: int, rounds: int, threads: int) -> None:
    import statistics

    import torch
    sys.path.insert(0, str(HERE))
    from llamacpp_setup import ensure_llamacpp
    from vs_llamacpp import run_llamacpp
    py, _ = ensure_llamacpp()
    g = torch.Generator().manual_seed(0)
    from freetoken.weights.gguf.reader import GgufFile
    vocab = GgufFile(path).config["vocab_size"]
    for plen in prompts:
        ft, ll = [], []
        for r in range(rounds):
            prompt = [torch.randint(100, vocab - 1, (plen,), generator=g).tolist()]   # fresh each round
            for engine in (("llama.cpp", "freetoken") if r % 2 == 0 else ("freetoken", "llama.cpp")):
                if engine == "llama.cpp":
                    ll.append(run_llamacpp(py, path, prompt, threads, decode))
                else:
                    ft.append(freetoken_child(path, prompt, threads, decode))
        med = lambda runs, k: statistics.median(x[k] for x in runs)  # noqa: E731
        print(f"speed at a {plen}-token prompt ({rounds} round(s), {decode} decoded): prefill FreeToken "
              f"{med(ft, 'prefill'):.1f} tok/s, llama.cpp {med(ll, 'prefill'):.1f} "
              f"({med(ft, 'prefill') / med(ll, 'prefill'):.2f}x); decode FreeToken {med(ft, 'decode'):.2f} tok/s, "
              f"llama.cpp {med(ll, 'decode'):.2f} ({med(ft, 'decode') / med(ll, 'decode'):.2f}x); "
              f"FreeToken backend {ft[-1]['backend']}", flush=True)


def freetoken_child(path: Path, prompt: list[list[int]], threads: int, decode: int) -> dict:
    """bench/vs_llamacpp.run_freetoken in a process of its own: the 17 GB pool is gone, page for
    page, before llama.cpp maps the file (closing an LLM in this process would leave the
    allocator's high water behind, and the two would not fit together on a 24 GiB machine)."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from vs_llamacpp import run_freetoken; "
            "a = json.loads(sys.stdin.read()); r = run_freetoken(*a); r.pop('llm'); print(json.dumps(r))")
    out = subprocess.run([sys.executable, "-c", code, str(HERE)], input=json.dumps([str(path), prompt, threads, decode]),
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if out.returncode:
        raise RuntimeError(f"FreeToken child failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def step_spread(path: Path, decode: int) -> None:
    """The routing's spread over each layer's experts beside the real Qwen3-30B-A3B trace's
    (bench/routing_spread.py): the disk step means something only if they agree."""
    print(f"routing spread over {decode} decoded tokens vs the real Qwen3-30B-A3B trace (bench/routing_spread.py):", flush=True)
    subprocess.run([sys.executable, str(HERE / "routing_spread.py"), "--gguf", str(path), "--decode", str(decode)],
                   env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)


def step_disk(path: Path, decode: int, rounds: int, threads: int, limit_mib: int | None) -> None:
    from freetoken.loading.disk_layout import gguf_layout
    from freetoken.weights.gguf.reader import GgufFile
    layout = gguf_layout(GgufFile(path))
    dense = path.stat().st_size - layout.nbytes
    # half the pool for the cache + the rest of the model + 1 GiB for KV cache, buffers, the runtime
    limit = limit_mib or int((layout.nbytes / 2 + dense + 2**30) / 2**20)
    print(f"disk tier: pool {gib(layout.nbytes)}, host cache half of it, every engine under a {limit} MiB "
          f"cgroup-v1 limit (bench/disk_tier.py):", flush=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, str(HERE / "disk_tier.py"), "--gguf", str(path), "--decode", str(decode),
                    "--rounds", str(rounds), "--threads", str(threads), "--cgroup-mib", str(limit)], env=env, check=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=48, help="layer count (48: Qwen3-30B-A3B's)")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/freetoken-real-size"))
    ap.add_argument("--steps", default="load,convert,speed,spread,disk")
    ap.add_argument("--prompt", default="512,4096")
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cgroup-mib", type=int, default=None, help="the disk step's memory limit (default: half "
                                                                 "the pool + the rest of the model + 1 GiB)")
    ap.add_argument("--keep", action="store_true", help="keep the GGUF and FTW files (default: deleted at the end)")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from vs_llamacpp import isa_line
    print(isa_line(args.threads), flush=True)
    args.dir.mkdir(parents=True, exist_ok=True)
    path = args.dir / f"qwen3-30b-a3b-shape-{args.layers}L-q4_k_m.gguf"
    ftw = path.with_suffix(".ftw")
    steps = args.steps.split(",")
    try:
        build(path, args.layers, "convert" in steps)
        print(f"model {path.name}: {args.layers} layers, {gib(path.stat().st_size)}; machine: "
              f"{gib(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'))} RAM, {os.cpu_count()} cores, "
              f"{args.threads} threads", flush=True)
        loaded = step_load(path) if "load" in steps else None
        if "convert" in steps:
            step_convert(path, ftw, loaded)
        if "speed" in steps:
            step_speed(path, [int(p) for p in args.prompt.split(",")], args.decode, args.rounds, args.threads)
        if "spread" in steps:
            step_spread(path, max(args.decode, 96))
        if "disk" in steps:
            step_disk(path, args.decode, max(1, args.rounds), args.threads, args.cgroup_mib)
    finally:
        if not args.keep:
            for p in (path, ftw, ftw.with_name(ftw.name + ".partial"), path.with_name(path.name + ".partial")):
                p.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
