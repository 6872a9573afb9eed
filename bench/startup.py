"""Cold start to the first generated token: an FTW file vs the HF safetensors directory, next
to a raw sequential read of the same bytes in the same run.

Each start runs in a fresh Python process after the model files' pages are dropped
(posix_fadvise(DONTNEED) on each file, `--drop files`, the default: a user switching models,
whose Python, torch and FreeToken code is already in memory) or after the whole page cache is
dropped (`--drop all`: `echo 3 > /proc/sys/vm/drop_caches`, root only; then the code's own
pages -- libtorch, .pyc files -- are read from the disk too, which the raw read does not pay).
Either way every byte of the weights comes from the disk. The clock starts after
`import freetoken` and stops when the first token is out (model build, weights, KV
allocation and one short prefill included).

    python bench/startup.py [--expert-format int8] [--source-dtype float32] [--repeats 2] [--drop files|all]

`--source-dtype` picks the HF checkpoint's own storage: bfloat16 (as built) or float32 (a copy
saved in fp32, as some checkpoints and fine-tunes ship: the HF start reads twice the bytes and
converts them to bf16; the FTW file's experts are converted to bf16 once).
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import CACHE, medium_checkpoint  # noqa: E402

# Qwen3-30B-A3B per-expert shapes, 4 layers x 32 experts: ~1.3 GB of bf16 experts.
SHAPE = dict(layers=4, experts=32, top_k=8, hidden=2048, vocab=8192, moe_intermediate_size=768,
             intermediate_size=6144, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
             max_position_embeddings=4096)
CHUNK = 16 << 20

CHILD = r"""
import time
t_python = time.time()                  # the interpreter is up; the parent passed its spawn time
import json, sys
from freetoken import LLM, SamplingParams
path, fmt, verify, spawned = sys.argv[1], sys.argv[2] or None, sys.argv[3] == "on", float(sys.argv[4])
t0 = time.perf_counter()
t_import = time.time() - t_python
llm = LLM(path, dtype="bfloat16", device="cpu", expert_format=fmt, max_model_len=512, max_num_seqs=1,
          verify_weights=verify)
t1 = time.perf_counter()
out = llm.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=1, temperature=0.0))
t2 = time.perf_counter()
phases = {"python": t_python - spawned, "import": t_import, **llm.engine.startup_timings, "prefill": t2 - t1}
print(json.dumps({"load_s": t1 - t0, "first_token_s": t2 - t0, "token": out[0].token_ids, "phases": phases}))
"""

DROP = "files"


def drop_cache(files: list[Path]) -> str:
    os.sync()
    how = "fadvise(DONTNEED) on the model files"
    if DROP == "all":
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            how = "drop_caches (whole page cache)"
        except OSError:
            how += " (drop_caches not permitted)"
    for p in files:                      # also per file: works unprivileged
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return how


def raw_read(files: list[Path], direct: bool, fresh: bool = False) -> float:
    """Seconds to read `files` front to back, one stream, 16 MiB at a time, into one reused
    buffer (the disk alone) or, `fresh`, into newly allocated memory of the file's size (what
    any load must also pay: page faults, which are slow on some VMs)."""
    t = time.perf_counter()
    for p in files:
        size = p.stat().st_size
        buf = mmap.mmap(-1, -(-size // 4096) * 4096 if fresh else CHUNK)
        view = memoryview(buf)
        fd = os.open(p, os.O_RDONLY | (os.O_DIRECT if direct else 0))
        try:
            if not direct:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            off = 0
            while True:
                dst = view[off:off + CHUNK] if fresh else view
                n = os.readv(fd, [dst])
                if n <= 0:
                    break
                off += n if fresh else 0
        finally:
            os.close(fd)
    return time.perf_counter() - t


REPO = Path(__file__).resolve().parent.parent


def child_env() -> dict:
    """The children import FreeToken from compiled bytecode, as an installed package does
    (pip writes .pyc files; a checkout run with PYTHONDONTWRITEBYTECODE would compile every
    module at every start, ~0.3 s here); the .pyc files go to a cache folder, not the tree."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(REPO), "PYTHONPYCACHEPREFIX": str(CACHE / "pycache")}


def start(path: Path, fmt: str | None, verify: bool = True) -> dict:
    env = child_env()
    r = subprocess.run([sys.executable, "-c", CHILD, str(path), fmt or "", "on" if verify else "off", repr(time.time())],
                       capture_output=True, text=True, env=env, cwd=REPO)
    if r.returncode:
        raise SystemExit(f"start from {path} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def source_checkpoint(src: Path, dtype: str) -> Path:
    """The bf16 startup checkpoint stored as `dtype` (built once, cached next to it)."""
    if dtype == "bfloat16":
        return src
    import shutil

    from safetensors.torch import load_file, save_file
    out = src.with_name(f"{src.name}-{dtype}")
    if (out / "config.json").exists():
        return out
    print(f"writing {out} ({dtype} copy of {src.name}) ...", flush=True)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    for f in sorted(tmp.glob("*.safetensors")):
        save_file({k: v.float() if v.is_floating_point() else v for k, v in load_file(str(f)).items()},
                  str(f), metadata={"format": "pt"})
    cfg = json.loads((tmp / "config.json").read_text())
    cfg["dtype"] = "float32"
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    tmp.rename(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--expert-format", default=None, choices=["int8", "mxfp4", "fp8"])
    ap.add_argument("--source-dtype", choices=["bfloat16", "float32"], default="bfloat16",
                    help="how the HF checkpoint stores its weights (see above)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--drop", choices=["files", "all"], default="files",
                    help="drop the model files' pages (default) or the whole page cache")
    args = ap.parse_args()
    global DROP
    DROP = args.drop

    src = source_checkpoint(medium_checkpoint("qwen3_moe", "qwen3-moe-startup", **SHAPE), args.source_dtype)
    experts = args.expert_format or "bf16"
    ftw = CACHE / f"{src.name}-{experts}.ftw"
    if not ftw.exists():
        from freetoken.loading.convert import convert
        print(f"converting {src} -> {ftw} ...", flush=True)
        convert(src, ftw, expert_format=args.expert_format, dtype="bfloat16")
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "freetoken")], env=child_env(), check=True)
    hf_files = sorted(src.glob("*.safetensors"))
    ftw_bytes, hf_bytes = ftw.stat().st_size, sum(p.stat().st_size for p in hf_files)

    rows: dict[str, list[float]] = {k: [] for k in ("raw_ftw", "raw_ftw_direct", "raw_ftw_fresh", "raw_hf",
                                                    "ftw", "ftw_noverify", "hf")}
    tokens, phases = {}, {}
    how = ""
    for _ in range(args.repeats):
        how = drop_cache([ftw])
        rows["raw_ftw"].append(raw_read([ftw], direct=False))
        drop_cache([ftw])
        rows["raw_ftw_direct"].append(raw_read([ftw], direct=True))
        drop_cache([ftw])
        rows["raw_ftw_fresh"].append(raw_read([ftw], direct=True, fresh=True))
        drop_cache(hf_files)
        rows["raw_hf"].append(raw_read(hf_files, direct=False))
        for name, path, verify in (("ftw", ftw, True), ("ftw_noverify", ftw, False), ("hf", src, True)):
            drop_cache([ftw, *hf_files])
            r = start(path, args.expert_format, verify)
            if not rows[name] or r["first_token_s"] < min(rows[name]):
                phases[name] = r["phases"]
            rows[name].append(r["first_token_s"])
            tokens[name] = r["token"]
    best = {k: min(v) for k, v in rows.items()}
    raw = min(best["raw_ftw"], best["raw_ftw_direct"])
    gb = 1e9
    print(f"\ncold start to first token, page cache: {how}; HF checkpoint in {args.source_dtype}; "
          f"experts {experts}; "
          f"best of {args.repeats}; {os.cpu_count()} cores")
    print(f"  FTW file {ftw_bytes / gb:.2f} GB, HF safetensors {hf_bytes / gb:.2f} GB")
    print(f"  raw sequential read, FTW file : {best['raw_ftw']:.2f} s buffered ({ftw_bytes / best['raw_ftw'] / gb:.2f} GB/s), "
          f"{best['raw_ftw_direct']:.2f} s O_DIRECT ({ftw_bytes / best['raw_ftw_direct'] / gb:.2f} GB/s)")
    print(f"  raw read into fresh memory    : {best['raw_ftw_fresh']:.2f} s O_DIRECT "
          f"({ftw_bytes / best['raw_ftw_fresh'] / gb:.2f} GB/s)")
    print(f"  raw sequential read, HF files : {best['raw_hf']:.2f} s ({hf_bytes / best['raw_hf'] / gb:.2f} GB/s)")
    print(f"  first token from FTW          : {best['ftw']:.2f} s ({ftw_bytes / best['ftw'] / gb:.2f} GB/s effective)")
    print(f"  ... with --verify off         : {best['ftw_noverify']:.2f} s "
          f"({ftw_bytes / best['ftw_noverify'] / gb:.2f} GB/s effective)")
    print(f"  first token from HF dir       : {best['hf']:.2f} s ({hf_bytes / best['hf'] / gb:.2f} GB/s effective)")
    print(f"  FTW start vs raw read of the same file: {raw / best['ftw']:.0%} of raw bandwidth "
          f"({raw / best['ftw_noverify']:.0%} with --verify off; "
          f"{best['raw_ftw_fresh'] / best['ftw']:.0%} of a raw read into fresh memory)")
    print(f"  HF start / FTW start: {best['hf'] / best['ftw']:.2f}x")
    print(f"  same first token: {tokens['ftw'] == tokens['hf']}")
    print("  phases of each start's best run (s): python = interpreter up, import = `import freetoken` "
          "(not in the first-token time); in LLM(): open = header (FTW: reads start in the background); "
          "build = model + experts (HF: the weights are read here; FTW: overlaps the reads); ready = FTW: "
          "waiting for the last reads and checksums; kv = KV cache + scheduler; prefill = the first token")
    for name, label in (("ftw", "FTW"), ("ftw_noverify", "FTW verify off"), ("hf", "HF dir")):
        p = phases[name]
        print(f"    {label:<15}" + "  ".join(f"{k} {v:.2f}" for k, v in p.items() if k != "total"))
    print("  all runs (s):", json.dumps({k: [round(x, 3) for x in v] for k, v in rows.items()}))


if __name__ == "__main__":
    main()
