"""Where a disk-tier decode step's time goes at a small host cache (issue 39, 5% of the pool): per
decoded token, in-process, wall time and CPU by thread (the decode thread, the kernel pool's
worker, the `freetoken-disk` I/O threads; /proc/self/task/<tid>/schedstat), the expert calls'
wall, the time blocked on reads, the reads still in flight when their layer came (`waited`), the
lookahead's guessing and the read-ahead calls on the decode thread, and per read: its wall on an
I/O thread and the part spent in xxh3; the decode thread's CPU a layer call outside the expert kernels
(`tier_hit_us_a_call` at full hits, `tier_other_us_a_call` with a miss or a read in flight; `--threads
1` puts the kernels on that thread too). The engine is the one
`PYTHONPATH` names; the timers wrap its methods, so the same copy of this script profiles any
tree of the same layout (`--handoff on` where the tree has experts/disk/handoff.py).

  PYTHONPATH=. python bench/disk_step_profile.py --cache-share 0.05 --rounds 3
  PYTHONPATH=. python bench/disk_step_profile.py --resident --rounds 3      # the same, experts resident

Each round is a fresh engine on a fresh random prompt (seeded), the file's page cache dropped first.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import threading
import time
from pathlib import Path

ACC: dict[str, float] = {}
LOCK = threading.Lock()


def add(key: str, dt: float) -> None:
    with LOCK:
        ACC[key] = ACC.get(key, 0.0) + dt


def timed(cls, name: str, key: str) -> None:
    """cls.name's wall time summed into ACC[key] (decode thread)."""
    fn = getattr(cls, name)

    def wrap(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            add(key, time.perf_counter() - t)
    setattr(cls, name, wrap)


def instrument() -> None:
    """Timers on the disk tier: forward, read-ahead calls, guessing, each read (run, hashed)."""
    import freetoken.experts.disk.backend as backend
    import freetoken.experts.disk.host_cache as hc
    timed(backend.DiskExperts, "forward", "forward")
    timed(backend.DiskExperts, "_predict", "predict")
    import freetoken.experts.disk.lookahead as lookahead
    import freetoken.experts.memory.next_layer as next_layer
    timed(lookahead.RouterLookahead, "guess", "router_guess")           # the router GEMV + top-k
    timed(next_layer.NextLayerPredictor, "predict", "history_guess")    # the history predictor's guess
    timed(hc.HostExpertCache, "prefetch", "prefetch")
    import freetoken.experts.disk.read_queue as rq
    many = hasattr(rq.ReadQueue, "put_many")       # (before it, one `put` a read)
    put, read_into, queued_at = getattr(rq.ReadQueue, "put_many" if many else "put"), hc.HostExpertCache._read_into, {}

    def timed_put(self, *a):
        reads, now = list(a[0]) if many else [a], time.perf_counter()
        queued_at.update((slot, now) for _, slot, _ in reads)
        return put(self, reads) if many else put(self, *a)

    def timed_read(self, flat, slot):
        t = time.perf_counter()
        add("queued", t - queued_at.pop(slot, t))
        try:
            return read_into(self, flat, slot)
        finally:
            add("read", time.perf_counter() - t)
            add("reads", 1)
    setattr(rq.ReadQueue, "put_many" if many else "put", timed_put)
    hc.HostExpertCache._read_into = timed_read
    hasher = hc.xxh3_64

    class TimedHash:
        def __init__(self):
            self.h = hasher()
            # the C read (experts/disk/c_reads.py) hashes with the hasher's state, untimed: there
            # `read_hash_ms` counts only the reads of the Python path
            self.state = getattr(self.h, "state", None)

        def update(self, b):
            t = time.perf_counter()
            self.h.update(b)
            add("hash", time.perf_counter() - t)

        def intdigest(self):
            return self.h.intdigest()
    hc.xxh3_64 = TimedHash


def tier_cpu() -> None:
    """The decode thread's CPU in each decode layer call outside the expert kernels (the tier's own
    Python: lookups, victims, read-ahead, guesses), summed apart for the calls at full hits
    (`_all_hits` took them) and the others (a miss or a read in flight): ACC["tier_hit"] etc."""
    import freetoken.experts.disk.backend as backend
    import freetoken.experts.execution.cpu as cpu
    now, state = time.thread_time_ns, {"kernels": 0, "hit": False}
    for name in ("run", "run_pairs", "combine"):
        def kernel(*a, _fn=getattr(cpu.CpuExpertExecutor, name), **k):
            t = now()
            try:
                return _fn(*a, **k)
            finally:
                state["kernels"] += now() - t
        setattr(cpu.CpuExpertExecutor, name, kernel)
    all_hits, forward = backend.DiskExperts._all_hits, backend.DiskExperts.forward

    def hits(*a, **k):
        state["hit"] = all_hits(*a, **k)
        return state["hit"]

    def call(self, *a, **k):
        if self.phase != "decode":
            return forward(self, *a, **k)
        state["kernels"], state["hit"], t = 0, False, now()
        out = forward(self, *a, **k)
        kind = "tier_hit" if state["hit"] else "tier_other"
        add(kind, (now() - t - state["kernels"]) / 1e9)
        add(kind + "_calls", 1)
        return out
    backend.DiskExperts._all_hits, backend.DiskExperts.forward = hits, call


def thread_ms() -> dict[str, float]:
    """CPU ms so far by role: the decode (main) thread, the I/O threads, the rest (kernel pool)."""
    names = {th.native_id: th.name for th in threading.enumerate()}
    out = {"decode": 0.0, "io": 0.0, "pool": 0.0}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except OSError:
            continue
        t = int(tid)
        role = "decode" if t == os.getpid() else "io" if names.get(t, "").startswith("freetoken-disk") else "pool"
        out[role] += ns / 1e6
    return out


def one_round(path: Path, opts: dict, prompt: list[int], decode: int, threads: int) -> dict:
    from freetoken import LLM, SamplingParams
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    llm = LLM(str(path), dtype="bfloat16", num_threads=threads, max_model_len=1024, prefix_cache=False, **opts)
    try:
        eng = llm.engine
        eng.add_request("r", prompt, SamplingParams(max_tokens=decode, temperature=0.0, ignore_eos=True))
        n = steps = 0
        while eng.has_unfinished():
            for out in eng.step():
                n += len(out.new_token_ids)
                steps += 1
                if steps == 1:               # decode only: from the first token on
                    ACC.clear()
                    t0, c0, s0 = time.perf_counter(), time.process_time(), thread_ms()
                    st0 = llm.expert_stats()
        t1, c1, s1 = time.perf_counter(), time.process_time(), thread_ms()
        st1 = llm.expert_stats()
    finally:
        llm.close()
    return summary(max(1, n - 1), max(1, steps - 1), t1 - t0, c1 - c0, s0, s1, st0, st1)


def summary(tok: int, steps: int, wall: float, cpu: float, s0: dict, s1: dict, st0: dict, st1: dict) -> dict:
    st0, st1 = st0 or {}, st1 or {}

    def delta(part: str, key: str) -> float:
        return ((st1.get(part) or {}).get(key, 0) - (st0.get(part) or {}).get(key, 0)) / tok
    reads = max(1.0, ACC.get("reads", 0.0))
    la = st1.get("lookahead") or {}         # the run's guess scores (whole run, prompt included)
    return {"tok_s": tok / wall, "ms_a_token": wall / tok * 1e3, "tokens_a_step": tok / steps,
            "cpu_ms": cpu / tok * 1e3, **{f"cpu_{k}_ms": (s1[k] - s0[k]) / tok for k in s1},
            "expert_calls_ms": ACC.get("forward", 0.0) / tok * 1e3,
            "blocked_ms": delta("disk", "read_s") * 1e3, "waited": delta("host_cache", "waited"),
            "reads": ACC.get("reads", 0.0) / tok, "mb": delta("disk", "bytes_read") / 1e6,
            "guessing_ms": ACC.get("predict", 0.0) / tok * 1e3,
            "router_guess_ms": ACC.get("router_guess", 0.0) / tok * 1e3,
            "history_guess_ms": ACC.get("history_guess", 0.0) / tok * 1e3, "read_ahead_ms": ACC.get("prefetch", 0.0) / tok * 1e3,
            "read_wall_ms": ACC.get("read", 0.0) / reads * 1e3, "read_hash_ms": ACC.get("hash", 0.0) / reads * 1e3,
            "handoffs": delta("disk", "handoffs"),
            **{f"{k}_us_a_call": ACC.get(k, 0.0) / max(1.0, ACC.get(k + "_calls", 0.0)) * 1e6
               for k in ("tier_hit", "tier_other")},
            "tier_ms": (ACC.get("tier_hit", 0.0) + ACC.get("tier_other", 0.0)) / tok * 1e3,
            "hit_calls": ACC.get("tier_hit_calls", 0.0) / tok, "other_calls": ACC.get("tier_other_calls", 0.0) / tok,
            **{f"la_{k}": la.get(k, 0.0) for k in ("precision", "recall", "router_f1", "history_f1")
               if isinstance(la.get(k), (int, float))}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, default=Path("/tmp/freetoken-real-size/qwen3-30b-a3b-shape-4L-q4_k_m.gguf"),
                    help="default: bench/real_size.py's 4-layer Qwen3-30B-A3B-shaped Q4_K_M file")
    ap.add_argument("--cache-share", type=float, default=0.05, help="host cache as a share of the expert pool")
    ap.add_argument("--resident", action="store_true", help="the experts resident instead (the reference)")
    ap.add_argument("--handoff", choices=("on", "off"), default=None, help="experts/disk/backend.HANDOFF")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if not args.gguf.exists():
        raise SystemExit(f"{args.gguf}: not found (bench/real_size.py builds it)")
    from freetoken.loading.disk_layout import gguf_layout
    from freetoken.weights.gguf.reader import GgufFile
    ck = GgufFile(args.gguf)
    opts = {"expert_tier": "ram"} if args.resident else \
        {"host_cache_gib": gguf_layout(ck).nbytes / 2**30 * args.cache_share}
    if not args.resident:
        instrument()
        tier_cpu()
    if args.handoff is not None:
        import freetoken.experts.disk.backend as backend
        backend.HANDOFF = args.handoff == "on"
    for r in range(args.rounds):
        rng = random.Random(r)
        prompt = [rng.randrange(10, ck.config["vocab_size"]) for _ in range(args.prompt_tokens)]
        row = one_round(args.gguf, opts, prompt, args.decode, args.threads)
        print(json.dumps({"round": r, "load": os.getloadavg()[0], **{k: round(v, 3) for k, v in row.items()}}),
              flush=True)


if __name__ == "__main__":
    main()
