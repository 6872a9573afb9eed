"""FreeToken replicas on Ray Serve: what prefix-aware routing saves, and what 2 replicas
serve next to one. On a local Ray instance with the tiny random-weight model.

  PYTHONPATH=. python bench/replicas.py [--sessions 24] [--turns 0] [--rounds 2]

1. Re-prefilled tokens (prompt tokens no prefix cache had) of held-out agent sessions
   (../shared/data/agent-sessions, tau-bench: the last --sessions of the 200; the tests use
   the first 6), every turn, replayed concurrently through 2 replicas with the prefix
   router, through 2 with round-robin, and through one in-process server with the same
   engine settings. Two replicas must each prefill the sessions' shared system prompt once,
   one server once in all: the printed floor is what that alone costs.
2. Aggregate throughput (prompt + generated tokens per second) of the same batch of fresh
   prompts (no prefix shared, so no cache hits) sent concurrently to 1 replica and to 2,
   alternating rounds; each replica has 1 CPU and 1 torch thread.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from freetoken.cli.serve import register  # noqa: E402
from freetoken.server.build import build  # noqa: E402
from freetoken.server.replicas.app import APP_NAME, build_application, resolve_model_dir, start_ray  # noqa: E402
from freetoken.server.replicas.replay import replay, session_bodies  # noqa: E402

from common import SHARED_DATA  # noqa: E402

SESSIONS = SHARED_DATA / "agent-sessions" / "tau-bench_gpt-4o-airline"


def serve_args(model_dir, *extra):
    p = argparse.ArgumentParser()
    register(p.add_subparsers(dest="c"))
    return p.parse_args(["serve", "--model", str(model_dir), "--dtype", "float32", "--max-model-len", "32768",
                         "--kv-cache-gib", "0.5", "--max-running-requests", "8", "--max-waiting-requests", "64",
                         "--served-model-name", "m", *extra])


def deploy(model_dir, replicas: int, routing: str, max_tokens_cap: int):
    from ray import serve
    try:
        serve.delete(APP_NAME)
    except Exception:  # noqa: BLE001 - nothing deployed yet
        pass
    args = serve_args(model_dir, "--replicas", str(replicas), "--replica-cpus", "1",
                      "--max-tokens-cap", str(max_tokens_cap))
    resolve_model_dir(args)
    serve.run(build_application(args, routing=routing), name=APP_NAME, route_prefix="/")


def fresh_prompts(n: int, words: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"model": "m", "max_tokens": 32, "temperature": 1.0, "seed": i,
             "messages": [{"role": "user", "content": " ".join(f"{rng.randrange(10**6):x}" for _ in range(words))}]}
            for i in range(n)]


def shared_prefix_tokens(llm, sessions) -> int:
    """Prompt tokens every session's first turn shares (system prompt and tools)."""
    from freetoken.server.replicas.route_key import prompt_ids
    tok = llm.tokenizer
    firsts = [prompt_ids(tok, "/v1/chat/completions", json.dumps(s[0]).encode()) for s in sessions]
    n = min(len(f) for f in firsts)
    k = 0
    while k < n and all(f[k] == firsts[0][k] for f in firsts):
        k += 1
    return k


def throughput(url: str, bodies: list[dict]) -> float:
    def one(b):
        r = httpx.post(url + "/v1/chat/completions", json=b, timeout=600)
        r.raise_for_status()
        u = r.json()["usage"]
        return u["prompt_tokens"] + u["completion_tokens"]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(bodies)) as ex:
        tokens = sum(ex.map(one, bodies))
    return tokens / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=24, help="held-out sessions: the last N of the file")
    ap.add_argument("--turns", type=int, default=0, help="turns per session (0: all)")
    ap.add_argument("--rounds", type=int, default=2, help="throughput rounds per side (alternating)")
    ap.add_argument("--batch", type=int, default=8, help="concurrent fresh prompts per throughput round")
    ap.add_argument("--words", type=int, default=600, help="words per fresh prompt")
    a = ap.parse_args()

    from ray import serve

    from freetoken.sim.sessions.read import read_sessions
    from freetoken.tiny import make_tiny
    sys.path.insert(0, str(ROOT / "tests" / "server"))
    from live_server import LiveServer

    work = Path(os.environ.get("TMPDIR", "/tmp")) / "freetoken-bench-replicas"
    model_dir = work / "tiny"
    if not (model_dir / "config.json").is_file():
        make_tiny("qwen3_moe", model_dir, max_position_embeddings=32768)
    held_out = read_sessions([SESSIONS])[-a.sessions:]
    sessions = session_bodies(held_out, a.turns or 10**6)

    llm, svc, app, _, _ = build(serve_args(model_dir, "--max-tokens-cap", "1", "--threads", "1"))
    srv = LiveServer(app)
    one = replay(srv.url, sessions)
    one_evicted = svc.engine.kv_usage().evicted
    shared = shared_prefix_tokens(llm, sessions)
    srv.stop()
    llm.close()

    start_ray(None, num_cpus=2, object_store_bytes=128 << 20)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    url = f"http://127.0.0.1:{port}"
    runs = {}
    for routing in ("prefix", "round-robin"):
        deploy(model_dir, 2, routing, 1)
        runs[routing] = replay(url, sessions)

    rates = {1: [], 2: []}
    for rnd in range(a.rounds):
        bodies = fresh_prompts(a.batch, a.words, seed=rnd)     # the same work on both sides
        for n in ((1, 2) if rnd % 2 == 0 else (2, 1)):
            deploy(model_dir, n, "prefix", 32)
            throughput(url, fresh_prompts(2, 50, seed=999 + rnd))            # warm-up
            rates[n].append(throughput(url, bodies))
    serve.shutdown()

    print(f"machine: {platform.machine()} {os.cpu_count()} cores; {len(sessions)} held-out tau-bench "
          f"sessions, {'all' if not a.turns else a.turns} turns, concurrently; one server's prefix "
          f"cache evicted {one_evicted} blocks")
    print(f"{'':28s} {'requests':>8s} {'prompt':>9s} {'cached':>9s} {'prefilled':>9s}")
    for name, t in (("one server", one), ("2 replicas, prefix router", runs["prefix"]),
                    ("2 replicas, round-robin", runs["round-robin"])):
        print(f"{name:28s} {t.requests:8d} {t.prompt_tokens:9d} {t.cached_tokens:9d} {t.prefilled:9d}"
              + (f"  ({t.failed} failed)" if t.failed else ""))
    p, r = runs["prefix"], runs["round-robin"]
    print(f"re-prefilled, prefix router / one server:  {p.prefilled / max(1, one.prefilled):.3f}x  "
          f"(floor: the {shared}-token shared prompt on the 2nd replica = "
          f"{(one.prefilled + shared) / max(1, one.prefilled):.3f}x)")
    print(f"re-prefilled, round-robin / prefix router: {r.prefilled / max(1, p.prefilled):.3f}x")
    print(f"re-prefilled, round-robin / one server:    {r.prefilled / max(1, one.prefilled):.3f}x")
    best1, best2 = max(rates[1]), max(rates[2])
    print(f"throughput (tokens/s, best of {a.rounds}): 1 replica {best1:.0f}, 2 replicas {best2:.0f}: "
          f"{best2 / best1:.2f}x  (rounds: 1={['%.0f' % x for x in rates[1]]} 2={['%.0f' % x for x in rates[2]]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
