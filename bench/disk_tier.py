"""The disk tier with the expert pool at twice the memory it may use: decode tok/s of
FreeToken's disk tier (host cache = half the pool, the file's page cache dropped first so
the disk is really read) against the fully resident pool, and against llama.cpp's mmap on the
same GGUF (if `llama_cpp` is importable), optionally the disk tier and llama.cpp under one
cgroup-v1 memory limit (`--cgroup-mib`; the resident reference runs outside it). Each engine runs alone in its own process, rounds alternate.
The disk tier must give the resident run's tokens exactly (checked, printed).

`--steps startup`: start to first token with the disk tier against the time to read the
non-expert (dense) weights, side by side, rounds alternating, the file's page cache dropped
(posix_fadvise(DONTNEED)) before each: (a) every non-expert tensor of the GGUF read with
`pread` into fresh memory, in file order (what any load of them pays: disk and page faults);
(b) a fresh process (clock started after `import freetoken`): `LLM(expert_tier="disk")` with a
small host cache (`--cache-share`, default here 10% of the pool) and the first token of a
short prompt, with the engine's start-up phases. The issue 29 target: (b) <= (a) + 1 s.

`--verify ab`: the cost of the disk tier's integrity checks (per-expert xxh3 of every read, the
file watch; experts/disk/integrity.py) end to end: disk-tier decode tok/s with verification on
and off in alternating rounds (the order swapped each round, each run a fresh process, the
page cache dropped first), the tokens of both compared, and the on/off ratio per round and as
the median of the rounds' ratios. The issue 36 target: verification costs <= 3% of decode.

`--speculative ab`: speculative decoding `auto` against `off` on free-running output (random
prompts, greedy: drafts rarely right), the disk tier (under `--cgroup-mib` if given) and the
resident tier (unless `--no-resident`), in alternating processes (the order swapped each round,
the same prompt for both sides), the tokens of both compared; per round the auto/off ratio of
decoded tokens a second, auto's tokens a step and verifies per drafter, and the median of the
rounds' ratios. The issue 34 target: auto >= 0.98x off on every tier (the price backs off).
`--lockstep` reads it in one process per tier instead: one engine, auto and off stepped in turn on
each of `--rounds` prompts (bench/spec_lockstep.py: the other side parked, the speculator attached
for auto's steps only, one host cache for both), so a neighbour's load moves both sides alike; the
median of the per-window ratios (`--window` step pairs) and the pooled ratio; `--control` runs the
same lockstep with both sides off (the method's own spread and bias).
`--speculative auto|off` runs the usual comparison with that mode on both tiers.

`--synthetic-layers N` uses (building it once, in --dir) the random-weight GGUF with
Qwen3-30B-A3B's real shapes and Q4_K_M types at N layers (bench/real_size.py's file).

  PYTHONPATH=. python bench/disk_tier.py [--gguf FILE] [--decode 32] [--rounds 2] [--cgroup-mib M]
  PYTHONPATH=. python bench/disk_tier.py --synthetic-layers 4 --cache-share 0.05 --verify ab --rounds 6
  PYTHONPATH=. python bench/disk_tier.py --synthetic-layers 4 --cache-share 0.05 --lookahead-depth 2 --no-llamacpp
  PYTHONPATH=. python bench/disk_tier.py --synthetic-layers 4 --cache-share 0.05 --handoff off --no-llamacpp
  PYTHONPATH=. python bench/disk_tier.py --synthetic-layers 12 --cache-share 0.4 --keep-first off --park on --no-llamacpp
  PYTHONPATH=. python bench/disk_tier.py --synthetic-layers 12 --cache-share 0.4 --populate off --no-llamacpp
  PYTHONPATH=. python bench/disk_tier.py --synthetic-layers 4 --cache-share 0.05 --read-budget off --no-llamacpp
  PYTHONPATH=. python bench/disk_tier.py --synthetic-layers 12 --speculative ab --rounds 4 --decode 32 --no-llamacpp
  PYTHONPATH=. python bench/disk_tier.py --synthetic-layers 12 --speculative ab --lockstep --rounds 4 --decode 64 --no-llamacpp
  PYTHONPATH=. python bench/disk_tier.py --steps startup --synthetic-layers 4 [--rounds 3] [--prompt-tokens 4]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_GGUF = Path.home() / ".cache" / "freetoken" / "bench" / "qwen3-moe-medium-q4_k_m.gguf"
CGROUP = Path("/sys/fs/cgroup/memory")

FT = textwrap.dedent("""
    import json, os, sys, time
    from freetoken import LLM, SamplingParams
    path, mode, n_decode, threads, cache_gib = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    policy, verify = sys.argv[6] or None, sys.argv[7] == "on"
    prompt = json.loads(sys.stdin.read())
    if not verify:       # A/B of the integrity checks (experts/disk/integrity.py): no checksums, no watch
        from freetoken.experts.disk.integrity import ExpertFileWatch
        ExpertFileWatch.open = classmethod(lambda cls, layout: None)
    fd = os.open(path, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
    # a host cache of 0 GiB: the memory plan sizes it (under a cgroup limit: what fits there)
    opts = (dict(host_cache_gib=cache_gib) if cache_gib > 0 else dict(expert_tier="disk")) if mode == "disk" else dict(expert_tier="ram")
    if policy:
        opts["expert_cache_policy"] = policy
    extra = json.loads(sys.argv[8]) if len(sys.argv) > 8 else {}
    if "speculative" in extra:       # --speculative: on either tier (an A/B of auto against off)
        opts["speculative"] = extra.pop("speculative")
    if mode == "disk":               # --lookahead / ... / --handoff / --read-budget
        opts.update(extra)
    import freetoken.experts.disk.backend as disk_backend
    if "handoff" in opts:        # --handoff on/off: victims' slots handed over mid-call or not (an A/B)
        disk_backend.HANDOFF = opts.pop("handoff")
    if "read_budget" in opts:    # --read-budget: the decode read-ahead's budget (off: none), an A/B
        disk_backend.READ_BUDGET = opts.pop("read_budget")
    if "read_ahead_first" in opts:   # --read-ahead-at: a call's read-ahead before or after its compute, an A/B
        disk_backend.READ_AHEAD_FIRST = opts.pop("read_ahead_first")
    if "prefill_read" in opts:   # --prefill-read: a prompt's reads of the next layer (routed / whole), an A/B
        disk_backend.PREFILL_READ = opts.pop("prefill_read")
    if "guesses_beside_demand" in opts:     # --guesses-beside-demand: guess reads started beside a demand read
        import freetoken.experts.disk.read_queue as read_queue
        read_queue.GUESSES_BESIDE_DEMAND = opts.pop("guesses_beside_demand")
    if "readers_batch" in opts:      # --readers-batch: the readers under SCHED_BATCH, an A/B
        import freetoken.experts.disk.read_queue as read_queue
        read_queue.READERS_BATCH = opts.pop("readers_batch")
    if "park" in opts:               # --park: the kernel pool's workers sleep while a call waits on a read, an A/B
        disk_backend.PARK = opts.pop("park")
    if "populate" in opts:           # --populate: the host cache's pages faulted in from its start, an A/B
        import freetoken.experts.disk.host_cache as host_cache
        host_cache.POPULATE = opts.pop("populate")
    if "keep_first" in opts:         # --keep-first: layer 0's experts the host cache's last victims, an A/B
        disk_backend.KEEP_FIRST = opts.pop("keep_first")
    if "extra_guesses" in opts:      # --extra-guesses: the router guess's runners-up read too, an A/B
        disk_backend.EXTRA_GUESSES = opts.pop("extra_guesses")
    depth = opts.pop("lookahead_depth", None)
    if depth is not None:        # layers read ahead (experts/disk/lookahead.DEPTH), for an A/B of it
        import freetoken.experts.disk.backend as disk_backend
        disk_backend.DEPTH = depth
    llm = LLM(path, dtype="bfloat16", num_threads=threads, max_model_len=1024, prefix_cache=False, **opts)
    eng = llm.engine
    eng.add_request("r", prompt, SamplingParams(max_tokens=n_decode, temperature=0.0, ignore_eos=True))
    toks, times = [], []
    read0 = 0
    t0 = time.perf_counter()
    while eng.has_unfinished():
        for out in eng.step():
            toks += out.new_token_ids
            times.append(time.perf_counter())
            if len(times) == 1:
                st0 = llm.expert_stats()
                read0 = (st0.get("disk") or {}).get("bytes_read", 0)
                cpu0 = time.process_time()     # every thread's CPU: hashing included, the neighbours' not
                n0 = len(toks)
                times[0] = time.perf_counter()
    st = llm.expert_stats()
    rss = int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM"))) * 1024
    per_tok = ((st.get("disk") or {}).get("bytes_read", 0) - read0) / max(1, len(times) - 1)
    def delta(get):          # decode only: after the first token
        return get(st) - get(st0)
    n_dec = max(1, len(times) - 1)
    split = {"kernel_calls_per_layer_call": delta(lambda s: s.get("kernel_calls", 0)) / max(1, delta(lambda s: s["total"]["calls"])),
             "expert_ms_per_token": delta(lambda s: s["total"]["wall_s"]) / n_dec * 1e3,
             "blocked_ms_per_token": delta(lambda s: (s.get("disk") or {}).get("read_s", 0.0)) / n_dec * 1e3,
             # decode's own read-ahead (the run's totals include the prefill's second-buffer reads)
             "decode_guesses": {k: delta(lambda s: (s.get("host_cache") or {}).get(k, 0))
                                for k in ("prefetches", "prefetch_used", "cancelled", "budget_cut", "misses")},
             # decode misses of layer 0 (guessed by history only, its input not known a layer ahead) and of the rest
             "decode_misses_layer0": delta(lambda s: s["per_layer"][0]["misses"]) if st.get("per_layer") else 0,
             # the host cache's pages faulted in ahead (host_rows.py `populate`) by the first decoded token
             "populated_gib_at_decode": (st0.get("host_cache") or {}).get("populated_gib", 0.0)}
    print(json.dumps({"prefill": len(prompt) / (times[0] - t0), "decode": (len(times) - 1) / (times[-1] - times[0]),
                      "tokens": toks, "hwm": rss, "host_cache": st.get("host_cache"), "disk": st.get("disk"),
                      "lookahead": st.get("lookahead"), "decode_bytes_per_token": per_tok, "split": split,
                      "cpu_s_per_token": (time.process_time() - cpu0) / max(1, len(times) - 1),
                      # "decode" and the per-token figures count engine steps (an output each); with
                      # speculation a step decodes this many tokens (compare trees at the same)
                      "tokens_a_step": (len(toks) - n0) / max(1, len(times) - 1),
                      # decoded tokens (not steps) a second: what --speculative ab compares
                      "tok_s": (len(toks) - n0) / max(times[-1] - times[0], 1e-9),
                      "spec": eng.spec.summary() if eng.spec is not None else None}))
""")


def _rest_ms(run: dict) -> float:
    """A decoded token's wall time outside the expert calls (attention, dense GEMVs, output
    head, sampling), ms: what the disk tier does not touch, so what tells the machine's window
    apart from the tier (the same tree alone read 17.5 and 23.2 tok/s in two windows of stop 46)."""
    d = run.get("split") or {}
    return 1e3 / run["decode"] - d["expert_ms_per_token"] if run.get("decode") and d else float("nan")


def split_line(res: dict, disk: dict) -> str:
    """Where a decoded token's time went: the layer calls' wall time (blocked on reads
    included), the kernel calls a layer call took and the rest of the step, resident against
    the disk tier."""
    r, d = res.get("split") or {}, disk.get("split") or {}
    if not d:
        return "expert split n/a"
    g = d.get("decode_guesses") or {}
    guesses = (f"decode read-ahead {g['prefetches']} started, {g['prefetch_used']} used, {g['cancelled']} cancelled, "
               f"{g['budget_cut']} cut by the budget, {g['misses']} misses ({d.get('decode_misses_layer0', 0)} of layer 0); "
               if g else "")
    return (guesses + f"expert calls {d['expert_ms_per_token']:.1f} ms a token ({d['blocked_ms_per_token']:.1f} blocked on reads; "
            f"resident {r.get('expert_ms_per_token', float('nan')):.1f}), "
            f"{d['kernel_calls_per_layer_call']:.2f} kernel calls a layer call, the rest of the step "
            f"{_rest_ms(disk):.1f} ms a token (resident {_rest_ms(res):.1f})")


# --speculative ab --lockstep: auto and off in one engine, step by step in turn (bench/spec_lockstep.py)
LOCKSTEP = textwrap.dedent("""
    import json, os, sys
    from freetoken import LLM, SamplingParams
    path, mode, n_decode, threads, cache_gib, bench = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
    sys.path.insert(0, bench)
    from spec_lockstep import lockstep
    prompts = json.loads(sys.stdin.read())
    fd = os.open(path, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
    opts = (dict(host_cache_gib=cache_gib) if cache_gib > 0 else dict(expert_tier="disk")) if mode == "disk" else dict(expert_tier="ram")
    llm = LLM(path, dtype="bfloat16", num_threads=threads, max_model_len=1024, prefix_cache=False, **opts)
    eng = llm.engine
    spec = eng.spec
    control = len(sys.argv) > 7 and sys.argv[7] == "control"    # --control: both sides plain, the method's spread
    params = lambda: SamplingParams(max_tokens=n_decode, temperature=0.0, ignore_eos=True)
    runs = []
    for i, prompt in enumerate(prompts):
        a = None if control else spec
        sides = {"auto": a, "off": None} if i % 2 == 0 else {"off": None, "auto": a}
        steps, toks = lockstep(eng, sides, prompt, params, f"p{i}")
        runs.append({"auto": steps["auto"], "off": steps["off"], "same": toks["auto"] == toks["off"],
                     "load": os.getloadavg()[0]})
    print(json.dumps({"runs": runs, "spec": spec.summary(), "host_cache": llm.expert_stats().get("host_cache")}))
""")


def spec_lockstep_ab(args, cache_gib: float, vocab: int, cg: str | None) -> None:
    """--speculative ab --lockstep: per tier one process, one engine, auto and off stepped in
    turn on each prompt (bench/spec_lockstep.py), the window ratios' median and the pooled ratio."""
    import random
    from spec_lockstep import rate, summary, window_ratios
    rng = random.Random(0)
    prompts = [[rng.randrange(10, vocab) for _ in range(args.prompt_tokens)] for _ in range(args.rounds)]
    for tier in (("disk",) if args.no_resident else ("disk", "resident")):
        res = run(LOCKSTEP, [str(args.gguf), tier, str(args.decode), str(args.threads), f"{cache_gib:.4f}", str(HERE),
                             "control" if args.control else ""], json.dumps(prompts), cg if tier == "disk" else None)
        if "error" in res:
            print(f"{tier} tier lockstep: error: {res['error']}")
            continue
        ratios, pooled = [], {"auto": [], "off": []}
        for i, r in enumerate(res["runs"]):
            w = window_ratios(r["off"], r["auto"], args.window)
            ratios += w
            for side in pooled:
                pooled[side] += r[side]
            print(f"{tier} prompt {i} (load {r['load']:.1f}): auto / off {rate(r['auto']) / rate(r['off']):.3f}x "
                  f"({len(w)} windows), tokens identical: {r['same']}, auto {sum(s[1] for s in r['auto']) / len(r['auto']):.2f} "
                  f"tokens a step", flush=True)
        drafters = ((res.get("spec") or {}).get("drafters")) or {}
        verifies = ", ".join(f"{d} {x['drafts']} verifies, {x['accepted_tokens']}/{x['proposed_tokens']} drafted tokens "
                             f"accepted" for d, x in drafters.items()) or "no verifies"
        hc = res.get("host_cache") or {}
        print(f"{tier} tier lockstep, auto / off: {summary(ratios) if ratios else 'no window'}, pooled "
              f"{rate(pooled['auto']) / rate(pooled['off']):.3f}x; {verifies}"
              + (f"; host-cache hit rate {hc.get('hit_rate', 0):.1%}" if tier == "disk" else ""))


# start to first token, disk tier; the clock starts after `import freetoken`
STARTUP = textwrap.dedent("""
    import json, sys, time
    from freetoken import LLM, SamplingParams
    path, threads, cache_gib = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    prompt = json.loads(sys.stdin.read())
    def disk_bytes():          # bytes this process made the storage layer fetch (readahead included)
        return int(next(l.split()[1] for l in open("/proc/self/io") if l.startswith("read_bytes")))
    io0 = disk_bytes()
    t0 = time.perf_counter()
    llm = LLM(path, dtype="bfloat16", num_threads=threads, max_model_len=512, max_num_seqs=1, prefix_cache=False,
              expert_tier="disk", host_cache_gib=cache_gib)
    t1 = time.perf_counter()
    io1 = disk_bytes()
    out = llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0))
    t2 = time.perf_counter()
    disk = llm.expert_stats().get("disk") or {}
    print(json.dumps({"construct_s": t1 - t0, "first_token_s": t2 - t0, "token": out[0].token_ids,
                      "phases": {**llm.engine.startup_timings, "first_token": t2 - t1},
                      "expert_bytes_read": disk.get("bytes_read", 0), "construct_disk_bytes": io1 - io0}))
""")


def drop_file_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def dense_ranges(path: Path) -> list[tuple[int, int]]:
    """(offset, nbytes) of every non-expert tensor of the GGUF, in file order."""
    from freetoken.weights.gguf.reader import GgufFile
    ck = GgufFile(path)
    return sorted((t.offset, t.nbytes) for name, (_, t) in ck.tensors_by_name.items() if "_exps." not in name)


def read_dense(path: Path, ranges: list[tuple[int, int]], piece: int = 64 << 20) -> float:
    """Seconds to pread `ranges` into fresh memory (one new array per tensor, as a load
    allocates), 64 MiB per call, the page cache dropped behind as the loader does."""
    import numpy as np
    t = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        for off, n in ranges:
            view = memoryview(np.empty(n, np.uint8))
            done = 0
            while done < n:
                k = os.preadv(fd, [view[done:min(n, done + piece)]], off + done)
                if k <= 0:
                    raise SystemExit(f"{path}: short read at {off + done}")
                os.posix_fadvise(fd, off + done, k, os.POSIX_FADV_DONTNEED)
                done += k
    finally:
        os.close(fd)
    return time.perf_counter() - t


def startup(args, cache_gib: float, vocab: int) -> None:
    import random
    rng = random.Random(1)
    ranges = dense_ranges(args.gguf)
    dense = sum(n for _, n in ranges)
    size = args.gguf.stat().st_size
    print(f"start to first token: {args.gguf.name} {size / 1e9:.2f} GB, non-expert tensors {dense / 1e9:.3f} GB "
          f"({len(ranges)} tensors), host cache {cache_gib:.2f} GiB, {args.prompt_tokens}-token prompt, "
          f"{args.threads} threads, page cache of the file dropped (fadvise DONTNEED) before each run", flush=True)
    rows: dict[str, list] = {"read": [], "start": []}
    for r in range(args.rounds):
        prompt = [rng.randrange(10, vocab) for _ in range(args.prompt_tokens)]
        for what in (("read", "start") if r % 2 == 0 else ("start", "read")):
            drop_file_cache(args.gguf)
            if what == "read":
                rows["read"].append(read_dense(args.gguf, ranges))
            else:
                res = run(STARTUP, [str(args.gguf), str(args.threads), f"{cache_gib:.4f}"], json.dumps(prompt), None)
                if "error" in res:
                    raise SystemExit(f"disk-tier start failed: {res['error']}")
                rows["start"].append(res)
        a, b = rows["read"][-1], rows["start"][-1]
        print(f"round {r}: (a) read non-expert weights {a:.2f} s ({dense / a / 1e9:.2f} GB/s); (b) disk-tier "
              f"start to first token {b['first_token_s']:.2f} s (LLM() {b['construct_s']:.2f} s); b - a = "
              f"{b['first_token_s'] - a:+.2f} s, b / a = {b['first_token_s'] / a:.2f}x; LLM() read "
              f"{b['construct_disk_bytes'] / 1e9:.3f} GB from the disk, the first token "
              f"{b['expert_bytes_read'] / 1e6:.0f} MB of experts; phases (s): "
              + ", ".join(f"{k} {v:.2f}" for k, v in b["phases"].items() if k != "total"), flush=True)
    a = sorted(rows["read"])[len(rows["read"]) // 2]
    b = sorted(x["first_token_s"] for x in rows["start"])[len(rows["start"]) // 2]
    print(f"median of {args.rounds}: (a) {a:.2f} s, (b) {b:.2f} s, b - a = {b - a:+.2f} s (target <= +1 s: "
          f"{'met' if b <= a + 1 else 'NOT met'}), b / a = {b / a:.2f}x")


def verify_ab(args, cache_gib: float, vocab: int) -> None:
    """Disk-tier decode with verification on and off, rounds alternating (see the docstring)."""
    import random
    rng = random.Random(0)
    rows: dict[str, list[dict]] = {"on": [], "off": []}
    ratios = []
    for r in range(args.rounds):
        stdin = json.dumps([rng.randrange(10, vocab) for _ in range(args.prompt_tokens)])
        for v in (("on", "off") if r % 2 == 0 else ("off", "on")):
            rows[v].append(run(FT, [str(args.gguf), "disk", str(args.decode), str(args.threads),
                                    f"{cache_gib:.4f}", args.policy, v, json.dumps(disk_options(args))], stdin, None))
        on, off = rows["on"][-1], rows["off"][-1]
        if "decode" in on and "decode" in off:
            ratios.append(on["decode"] / off["decode"])
        hc = on.get("host_cache") or {}
        print(f"round {r} ({'on first' if r % 2 == 0 else 'off first'}): verify on {tok_s(on)}, off {tok_s(off)}, "
              f"on/off {ratio(on, off)}; tokens identical: {on.get('tokens') == off.get('tokens') if 'tokens' in on else 'n/a'}; "
              f"CPU per token on {on.get('cpu_s_per_token', 0) * 1e3:.0f} ms, off {off.get('cpu_s_per_token', 0) * 1e3:.0f} ms; "
              f"host-cache hit rate {hc.get('hit_rate', 0):.1%}, {on.get('decode_bytes_per_token', 0) / 1e6:.1f} MB "
              f"read per decoded token" + "".join(f"; verify {k} error: {x['error']}" for k, x in (("on", on), ("off", off))
                                                  if "error" in x), flush=True)
    if not ratios:
        raise SystemExit("verify A/B: no round ran both sides")
    from statistics import median
    med = median(ratios)
    cpu = median(on["cpu_s_per_token"] / off["cpu_s_per_token"] for on, off in zip(rows["on"], rows["off"])
                 if "decode" in on and "decode" in off)
    print(f"median decode tok/s: verify on {tok_s(median_run(rows['on']))}, off {tok_s(median_run(rows['off']))}; "
          f"median of the rounds' on/off ratios {med:.3f} (cost of verification {100 * (1 - med):+.1f}% of decode, "
          f"target <= 3%: {'met' if med >= 0.97 else 'NOT met'}; ratios " + ", ".join(f"{x:.3f}" for x in ratios) +
          f"); process CPU per decoded token on/off (median) {cpu:.3f}")


def spec_ab(args, cache_gib: float, vocab: int, cg: str | None) -> None:
    """Speculation auto against off, free-running (random prompts, greedy: drafts rarely right),
    rounds alternating (the order swapped each round, each run a fresh process; the disk tier
    under the cgroup, the resident tier outside it), tokens compared (see the docstring)."""
    import random
    from statistics import median
    rng = random.Random(0)
    tiers = ("disk",) if args.no_resident else ("disk", "resident")
    ratios: dict[str, list[float]] = {t: [] for t in tiers}
    for r in range(args.rounds):
        stdin = json.dumps([rng.randrange(10, vocab) for _ in range(args.prompt_tokens)])
        for tier in tiers:
            got = {}
            for side in (("auto", "off") if r % 2 == 0 else ("off", "auto")):
                got[side] = run(FT, [str(args.gguf), tier, str(args.decode), str(args.threads), f"{cache_gib:.4f}",
                                     args.policy, args.verify, json.dumps({**disk_options(args), "speculative": side})],
                                stdin, cg if tier == "disk" else None)
            on, off = got["auto"], got["off"]
            ok = "tok_s" in on and "tok_s" in off
            if ok:
                ratios[tier].append(on["tok_s"] / off["tok_s"])
            drafters = ((on.get("spec") or {}).get("drafters")) or {}
            verifies = ", ".join(f"{d} {x['drafts']} verifies, {x['accepted_tokens']}/{x['proposed_tokens']} drafted "
                                 f"tokens accepted" for d, x in drafters.items()) or "no verifies"
            hc = on.get("host_cache") or {}
            price = (on.get("spec") or {}).get("price") or {}
            if "per_expert_beyond_one_s" in price:     # the reads a verify's extra experts wait on, priced
                verifies += (f"; priced: an expert beyond one position's {price['per_expert_beyond_one_s'] * 1e3:.2f} ms "
                             f"of reads, a plain step's {price['blocked_plain_s'] * 1e3:.1f} ms")
            print(f"round {r} {tier} ({'auto first' if r % 2 == 0 else 'off first'}; load {os.getloadavg()[0]:.1f}): "
                  f"auto {on.get('tok_s', 0):.2f} tok/s, off {off.get('tok_s', 0):.2f} tok/s, auto/off "
                  f"{on['tok_s'] / off['tok_s'] if ok else float('nan'):.3f}; tokens identical: "
                  f"{on.get('tokens') == off.get('tokens') if ok else 'n/a'}; auto {on.get('tokens_a_step', 0):.2f} "
                  f"tokens a step ({verifies}); CPU per token auto {on.get('cpu_s_per_token', 0) * 1e3:.0f} ms, off "
                  f"{off.get('cpu_s_per_token', 0) * 1e3:.0f} ms" + (f"; host-cache hit rate auto {hc.get('hit_rate', 0):.1%}, "
                  f"off {(off.get('host_cache') or {}).get('hit_rate', 0):.1%}" if tier == "disk" else "")
                  + "".join(f"; {k} error: {x['error']}" for k, x in got.items() if "error" in x), flush=True)
    for tier in tiers:
        xs = ratios[tier]
        if xs:
            med = median(xs)
            print(f"{tier} tier: median of the rounds' auto/off ratios {med:.3f} (target >= 0.98: "
                  f"{'met' if med >= 0.98 else 'NOT met'}; ratios " + ", ".join(f"{x:.3f}" for x in xs) + ")")
        else:
            print(f"{tier} tier: no round ran both sides")


def disk_options(args) -> dict:
    """The disk tier's lookahead / direct-I/O / queue-depth options given on the command line."""
    return {k: v for k, v in (("expert_lookahead", args.lookahead), ("disk_direct_io", args.direct_io),
                              ("disk_io_threads", args.io_threads), ("lookahead_depth", args.lookahead_depth),
                              ("extra_guesses", args.extra_guesses),
                              ("keep_first", None if args.keep_first is None else args.keep_first == "on"),
                              ("park", None if args.park is None else args.park == "on"),
                              ("populate", None if args.populate is None else args.populate == "on"),
                              ("readers_batch", None if args.readers_batch is None else {"off": None}.get(args.readers_batch, args.readers_batch)),
                              ("handoff", None if args.handoff is None else args.handoff == "on"),
                              ("prefill_read", args.prefill_read),
                              ("read_ahead_first", None if args.read_ahead_at is None else args.read_ahead_at == "start"))
            if v is not None} | ({} if args.read_budget is None else
                                 {"read_budget": None if args.read_budget == "off" else float(args.read_budget)}) \
        | ({} if args.guesses_beside_demand is None else
           {"guesses_beside_demand": None if args.guesses_beside_demand == "all" else int(args.guesses_beside_demand)})


def lookahead_line(disk: dict) -> str:
    """Next-layer guesses: share of the host cache's would-be misses they covered, wasted
    reads per useful one, and the guesses' precision / recall against what the layer routed."""
    la, io = disk.get("lookahead") or {}, (disk.get("disk") or {}).get("io") or {}
    if not la:
        return "lookahead n/a"
    return (f"lookahead {la.get('mode', '?')} (guessing: {la['source']}): {la['misses_covered']:.0%} of next-layer misses covered, "
            f"{la['wasted_per_useful']:.2f} wasted reads per useful read, guesses right {la['precision']:.0%}, "
            f"next layer's experts guessed {la['recall']:.0%}; {la.get('cancelled', 0)} wrong guesses cancelled "
            f"before reading, {la.get('budget_cut', 0)} cut by the read budget; prompt's next-layer reads: "
            f"{la.get('prefill_guessed', 0)} guessed, {la.get('prefill_precision', 0):.0%} right, "
            f"{la.get('prefill_recall', 0):.0%} of what it routed; reads {io.get('mode', '?')}")


def tok_s(res: dict) -> str:
    """An engine's decode figure, or "not run" (never 0.00: a run that failed or was skipped)."""
    return f"{res['decode']:.2f} tok/s" if "decode" in res else "not run"


def ratio(a: dict, b: dict) -> str:
    return f"{a['decode'] / b['decode']:.2f}x" if "decode" in a and "decode" in b and b["decode"] > 0 else "n/a"


def median_run(runs: list[dict]) -> dict:
    ok = sorted((r for r in runs if "decode" in r), key=lambda r: r["decode"])
    return ok[len(ok) // 2] if ok else {}


def _in_cgroup(name: str | None):
    if not name:
        return None
    tasks = CGROUP / name / "tasks"
    return lambda: tasks.write_text(str(os.getpid()))


def run(script: str, args: list[str], stdin: str, cgroup: str | None, extra_path: str = "") -> dict:
    env = {**os.environ, "PYTHONPATH": f"{HERE.parent}{os.pathsep}{extra_path}"}
    if env.pop("PYTHONDONTWRITEBYTECODE", None):      # compiled bytecode, as an installed package has
        env["PYTHONPYCACHEPREFIX"] = str(Path.home() / ".cache" / "freetoken" / "bench" / "pycache")
    p = subprocess.run([sys.executable, "-c", script, *args], input=stdin, capture_output=True, text=True,
                       env=env, preexec_fn=_in_cgroup(cgroup))
    if p.returncode:
        last = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
        if p.returncode < 0:            # a signal: -9 under a memory limit is the OOM killer
            return {"error": f"killed by signal {-p.returncode}" + (" (out of memory?)" if p.returncode == -9 else "")
                    + (f"; last line: {last}" if last else "")}
        return {"error": last or f"exit {p.returncode}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("--synthetic-layers", type=int, default=None,
                    help="use the real-shaped synthetic Q4_K_M GGUF of this many layers (built once in --dir)")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/freetoken-real-size"))
    ap.add_argument("--steps", default="decode", help="decode (the default), startup, or both: decode,startup")
    ap.add_argument("--prompt-tokens", type=int, default=None, help="default 64 (decode), 4 (startup)")
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache-share", type=float, default=None,
                    help="host cache as a share of the pool (default 0.5, or under --cgroup-mib the engine's plan; startup: 0.1)")
    ap.add_argument("--cgroup-mib", type=int, default=None,
                    help="run every engine under a cgroup-v1 memory limit of this many MiB")
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--policy", default="", help="the disk tier's expert_cache_policy (default: the engine's)")
    ap.add_argument("--verify", default="on", choices=("on", "off", "ab"),
                    help="off: no per-expert checksums or file watch; ab: disk tier only, verification "
                         "on and off in alternating rounds with their ratio (what the checks cost)")
    ap.add_argument("--speculative", default=None, choices=("auto", "off", "ab"),
                    help="speculative decoding on both tiers (default: the engine's, auto); ab: auto and off in "
                         "alternating rounds, free-running, with their ratio (what speculation costs or pays)")
    ap.add_argument("--lockstep", action="store_true",
                    help="--speculative ab: auto and off in one engine per tier, step by step in turn on each "
                         "prompt (--rounds prompts; bench/spec_lockstep.py), the median of --window step pairs' ratios")
    ap.add_argument("--window", type=int, default=8, help="--lockstep: step pairs per window ratio")
    ap.add_argument("--control", action="store_true",
                    help="--lockstep: both sides off (the auto side's speculator detached): the method's own spread")
    ap.add_argument("--no-resident", action="store_true", help="skip the resident reference (no token check)")
    ap.add_argument("--lookahead", default=None, choices=("auto", "router", "history", "off"),
                    help="the disk tier's expert_lookahead (default: the engine's)")
    ap.add_argument("--direct-io", default=None, choices=("auto", "on", "off"), help="the disk tier's disk_direct_io")
    ap.add_argument("--io-threads", type=int, default=None, help="the disk tier's disk_io_threads (reads in flight)")
    ap.add_argument("--readers-batch", choices=("all", "guesses", "off"), default=None,
                    help="disk readers under SCHED_BATCH: every one, all but the demand-only one, none "
                         "(experts/disk/read_queue.READERS_BATCH, default off)")
    ap.add_argument("--extra-guesses", type=int, default=None,
                    help="decode: read this many of the next layer's experts its router ranks after its top-k "
                         "(experts/disk/backend.EXTRA_GUESSES, default 0)")
    ap.add_argument("--keep-first", default=None, choices=("on", "off"),
                    help="the host cache gives up layer 0's experts last (experts/disk/backend.KEEP_FIRST, default on)")
    ap.add_argument("--park", default=None, choices=("on", "off"),
                    help="the kernel pool's workers sleep while a layer call waits on a read "
                         "(experts/disk/backend.PARK, default off)")
    ap.add_argument("--populate", default=None, choices=("on", "off"),
                    help="the host cache's pages faulted in from its start on an idle thread, not by the reads "
                         "(experts/disk/host_cache.POPULATE, default on)")
    ap.add_argument("--lookahead-depth", type=int, default=None,
                    help="layers the disk tier reads ahead (experts/disk/lookahead.DEPTH; default: the engine's)")
    ap.add_argument("--handoff", default=None, choices=("on", "off"),
                    help="a call hands its victims' slots to the next layer's reads mid-call (experts/disk/handoff.py)")
    ap.add_argument("--prefill-read", default=None, choices=("routed", "layer"),
                    help="what a prompt reads of the next layer: the router's guess for its tokens, or the "
                         "whole layer (experts/disk/backend.PREFILL_READ; default: the engine's)")
    ap.add_argument("--read-ahead-at", default=None, choices=("start", "end"),
                    help="a layer call starts its read-ahead once it holds its experts, or after it has run "
                         "(experts/disk/backend.READ_AHEAD_FIRST; default: the engine's)")
    ap.add_argument("--read-budget", default=None,
                    help="the decode read-ahead's read budget (a ratio >= 1, or off; experts/disk/backend.READ_BUDGET)")
    ap.add_argument("--guesses-beside-demand", default=None,
                    help="guess reads that may start while a demand read is queued or read (a count, or all; "
                         "experts/disk/read_queue.GUESSES_BESIDE_DEMAND; default: the engine's)")
    args = ap.parse_args()
    if args.guesses_beside_demand not in (None, "all") and not args.guesses_beside_demand.isdigit():
        ap.error(f"--guesses-beside-demand: a count or all, got {args.guesses_beside_demand!r}")
    if args.read_budget not in (None, "off"):
        try:
            if float(args.read_budget) < 1:
                raise ValueError
        except ValueError:
            ap.error(f"--read-budget: a ratio >= 1 or off, got {args.read_budget!r}")
    steps = args.steps.split(",")
    sys.path.insert(0, str(HERE))
    if args.synthetic_layers:
        from real_size import build
        args.dir.mkdir(parents=True, exist_ok=True)
        args.gguf = args.dir / f"qwen3-30b-a3b-shape-{args.synthetic_layers}L-q4_k_m.gguf"
        build(args.gguf, args.synthetic_layers)

    import random
    from freetoken.loading.disk_layout import gguf_layout
    from freetoken.weights.gguf.reader import GgufFile
    from vs_llamacpp import LLAMA_RUN as LLAMA, WARMUP, isa_line
    layout = gguf_layout(GgufFile(args.gguf))
    pool_gib = layout.nbytes / 2**30
    rng = random.Random(0)
    vocab = GgufFile(args.gguf).config["vocab_size"]
    if "startup" in steps:
        print(isa_line(args.threads))
        share = 0.1 if args.cache_share is None else args.cache_share
        startup(argparse.Namespace(**{**vars(args), "prompt_tokens": args.prompt_tokens or 4}), pool_gib * share, vocab)
        if "decode" not in steps:
            return
    # under a memory limit without --cache-share, the engine's own plan sizes the host cache
    # (what a user gets); otherwise half the pool, forced
    planned = args.cgroup_mib is not None and args.cache_share is None
    args.cache_share = 0.0 if planned else 0.5 if args.cache_share is None else args.cache_share
    args.prompt_tokens = args.prompt_tokens or 64
    cache_gib = pool_gib * args.cache_share
    if args.verify == "ab":
        print(isa_line(args.threads))
        print(f"model {args.gguf.name}: expert pool {pool_gib:.2f} GiB, host cache {cache_gib:.2f} GiB "
              f"({args.cache_share:.0%}), {args.prompt_tokens}-token prompt, {args.decode} decoded, "
              f"{args.threads} threads, policy {args.policy or 'default'}; disk tier, verification on vs off")
        return verify_ab(args, cache_gib, vocab)
    cg = None
    if args.cgroup_mib:
        cg = f"freetoken-disk-tier-{os.getpid()}"
        (CGROUP / cg).mkdir()
        (CGROUP / cg / "memory.limit_in_bytes").write_text(str(args.cgroup_mib * 2**20))
    try:
        import importlib.util
        have_ll = not args.no_llamacpp and importlib.util.find_spec("llama_cpp") is not None
        if "startup" not in steps:
            print(isa_line(args.threads))
        hc = "sized by the memory plan under the limit" if planned else f"{cache_gib:.2f} GiB ({args.cache_share:.0%})"
        print(f"model {args.gguf.name}: expert pool {pool_gib:.2f} GiB, host cache {hc}, "
              f"cgroup {args.cgroup_mib or 'none'} MiB, {args.prompt_tokens}-token prompt, "
              f"{args.decode} decoded, {args.threads} threads"
              + (f", speculation {args.speculative}" if args.speculative else ""))
        if args.speculative == "ab":
            return (spec_lockstep_ab if args.lockstep else spec_ab)(args, cache_gib, vocab, cg)
        rows: dict[str, list[dict]] = {"resident": [], "disk": [], "llama.cpp mmap": []}
        for r in range(args.rounds):
            prompt = [rng.randrange(10, vocab) for _ in range(args.prompt_tokens)]   # fresh each round
            stdin = json.dumps(prompt)
            base = [str(args.gguf), "", str(args.decode), str(args.threads), f"{cache_gib:.4f}", args.policy,
                    args.verify, json.dumps({**disk_options(args), **({"speculative": args.speculative}
                                                                      if args.speculative else {})})]
            for mode in (("disk",) if args.no_resident else ("resident", "disk")):
                a = list(base)
                a[1] = mode        # the resident reference (its tokens) runs outside the limit: it cannot fit
                rows[mode].append(run(FT, a, stdin, cg if mode == "disk" else None))
            if have_ll:
                drop = os.open(args.gguf, os.O_RDONLY)
                os.posix_fadvise(drop, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(drop)
                # under a limit, as llama.cpp runs a model larger than its memory: --no-repack (with
                # repacking it copies every expert into anonymous memory, which the limit refuses)
                rows["llama.cpp mmap"].append(run(LLAMA, [str(args.gguf), str(args.threads), str(args.decode),
                                                          *(["no-repack"] if cg else [])],
                                                  json.dumps([WARMUP, [prompt]]), cg))
            res = rows["resident"][-1] if rows["resident"] else {"error": "not run (--no-resident)"}
            disk = rows["disk"][-1]
            same = "tokens" in res and res.get("tokens") == disk.get("tokens")
            ll = rows["llama.cpp mmap"][-1] if have_ll else {"error": "not run (llama_cpp is not installed)"
                                                             if not args.no_llamacpp else "not run (--no-llamacpp)"}
            print(f"round {r}: resident {tok_s(res)}, disk tier {tok_s(disk)} ({ratio(disk, res)}), llama.cpp mmap "
                  f"{tok_s(ll)}; disk vs llama.cpp {ratio(disk, ll)}; tokens identical to resident: "
                  f"{same if 'tokens' in disk and 'tokens' in res else 'n/a'}; host-cache hit rate "
                  f"{(disk.get('host_cache') or {}).get('hit_rate', 0):.1%} of "
                  f"{(disk.get('host_cache') or {}).get('gib', 0):.2f} GiB, "
                  f"{(disk.get('disk') or {}).get('bytes_read', 0) / 1e9:.2f} GB read, "
                  f"{disk.get('decode_bytes_per_token', 0) / 1e6:.1f} MB per decoded token, prefill "
                  f"{disk.get('prefill', 0):.1f} tok/s, next-layer guesses used "
                  f"{(disk.get('host_cache') or {}).get('prefetch_hit_rate', 0):.0%} "
                  f"({(disk.get('host_cache') or {}).get('prefetch_wasted_bytes', 0) / 1e9:.2f} GB read for nothing); "
                  f"{lookahead_line(disk)}; {split_line(res, disk)}; CPU {disk.get('cpu_s_per_token', 0) * 1e3:.0f} ms "
                  f"a decoded token (resident {res.get('cpu_s_per_token', 0) * 1e3:.0f}); "
                  f"{disk.get('tokens_a_step', float('nan')):.2f} tokens a step (resident "
                  f"{res.get('tokens_a_step', float('nan')):.2f}); host cache pages faulted in ahead by the first "
                  f"decoded token {(disk.get('split') or {}).get('populated_gib_at_decode', 0):.2f} GiB; peak RSS resident "
                  f"{res.get('hwm', 0) / 2**30:.2f} GiB, disk {disk.get('hwm', 0) / 2**30:.2f} GiB"
                  + "".join(f"; {k} error: {v['error']}" for k, v in (("resident", res), ("disk", disk),
                                                                       ("llama.cpp", ll)) if "error" in v))
        med = {k: median_run(v) for k, v in rows.items()}
        if med["disk"]:
            print(f"disk tier ({args.policy or 'default policy'}, verify {args.verify}): median "
                  f"{med['disk']['decode_bytes_per_token'] / 1e6:.1f} MB read per decoded token")
        print("median decode tok/s: " + ", ".join(f"{k} {tok_s(v)}" for k, v in
                                                  (("resident", med["resident"]), ("disk tier", med["disk"]),
                                                   ("llama.cpp mmap", med["llama.cpp mmap"] if have_ll else {}))))
    finally:
        if cg:
            (CGROUP / cg).rmdir()


if __name__ == "__main__":
    main()
