"""Mutation fuzz of the HTTP API (bench/fuzz_cases.py: seeded, deterministic) against a live
server on 127.0.0.1: every answer must be < 500 and in its protocol's error shape (4xx), a
200 must be strict JSON (no NaN/Infinity) and a 200 stream must end with its protocol's final
event, each case must be answered within --case-limit seconds (1), and the server must still
be healthy with no 5xx in /metrics at the end. Prints counts by status, family and route.

--canary: the server runs as `freetoken serve` in a child process (its RSS alone), a second
process streams a canary chat request all the time, and for each case the canary's largest
inter-token gap while the case ran and the server's RSS after it (against before) are taken;
the probe's heavy bodies (30 MB of empty lists, 50k stop strings, ...) come first.

--files N: N seeded mutations of the tiny model's files (config, tokenizer, generation config,
chat template, safetensors, FTW, GGUF) through `freetoken generate` in this process
(bench/bad_files.py's runner): each must run (exit 0) or stop with one line and exit 2.

    PYTHONPATH=. python bench/fuzz_api.py --cases 3000 --seed 0
    PYTHONPATH=. python bench/fuzz_api.py --cases 300 --canary
    PYTHONPATH=. python bench/fuzz_api.py --cases 0 --files 60
"""
from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests" / "server")]

from fuzz import protocol_problem  # noqa: E402
from fuzz_cases import Case, generate  # noqa: E402

ADMIN_TOKEN = "fuzz-admin"


def _strict(text: str) -> None:
    def bad(tok):
        raise ValueError(f"non-JSON number {tok}")
    json.loads(text, parse_constant=bad)


def answer_problem(case: Case, status: int, headers: dict, text: str) -> str | None:
    if status == 400 and headers.get("content-type", "").startswith("text/plain") and not text.startswith("{"):
        return None                          # uvicorn/h11 refusing malformed HTTP before the app
    if case.method == "HEAD":
        return f"{status}: {text[:200]}" if status >= 500 else None     # a HEAD reply has no body
    path = case.path.split("?")[0]
    why = protocol_problem(path, status, text, case.stream and "event-stream" in headers.get("content-type", ""))
    if why:
        return why
    if status == 200 and case.method != "HEAD":
        try:
            if "event-stream" in headers.get("content-type", ""):
                for line in text.splitlines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        _strict(line[6:])
            else:
                _strict(text)
        except ValueError as e:
            return f"200 that is not strict JSON ({e}): {text[:200]}"
    return None


def send(host: str, port: int, case: Case, timeout: float = 60.0) -> tuple[int, dict, str]:
    """The case as is (http.client sends any header bytes and parses chunked replies)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.putrequest(case.method, case.path, skip_host=True, skip_accept_encoding=True)
        hdrs = {"host": "127.0.0.1", **{k.lower(): v for k, v in case.headers.items()}}
        for k, v in hdrs.items():
            conn.putheader(k, v.encode("utf-8", "surrogatepass"))
        if case.body is not None:
            conn.putheader("content-length", str(len(case.body)))
        conn.endheaders(case.body)
        r = conn.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data.decode("utf-8", "replace")
    finally:
        conn.close()


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run_cases(url: str, cases: list[Case], case_limit: float = 1.0, on_case=None) -> dict:
    """Send each case in order; on_case(case, t0, t1) runs after each (the canary's probe)."""
    import httpx
    from urllib.parse import urlparse
    u = urlparse(url)
    by_status: dict[str, int] = {}
    by_family: dict[str, dict[str, int]] = {}
    by_route: dict[str, dict[str, int]] = {}
    problems, slow, times = [], [], []
    t_start = time.monotonic()
    for i, case in enumerate(cases):
        t0 = time.monotonic()
        try:
            status, headers, text = send(u.hostname, u.port, case)
        except (OSError, http.client.HTTPException) as e:
            status, headers, text = 0, {}, f"no answer: {type(e).__name__}: {e}"
        t1 = time.monotonic()
        times.append(t1 - t0)
        key = str(status)
        by_status[key] = by_status.get(key, 0) + 1
        by_family.setdefault(case.family, {})[key] = by_family.get(case.family, {}).get(key, 0) + 1
        by_route.setdefault(case.route, {})[key] = by_route.get(case.route, {}).get(key, 0) + 1
        why = "no answer" if status == 0 else answer_problem(case, status, headers, text)
        if why:
            problems.append(f"#{i} {case.family} {case.method} {case.path[:80]} body={(case.body or b'')[:160]!r}: {why[:300]}")
        if t1 - t0 > case_limit:
            slow.append(f"#{i} {case.family} {case.route} {t1 - t0:.2f} s status {status}")
        if on_case:
            on_case(i, case, t0, t1)
    with httpx.Client(base_url=url, headers={"host": "127.0.0.1"}, timeout=30) as c:
        health = c.get("/health").json().get("status")
        metrics = c.get("/metrics").text
    server_5xx = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                     if line.startswith('freetoken_http_errors_total{status="5'))
    return {"cases": len(cases), "elapsed_s": round(time.monotonic() - t_start, 1), "by_status": by_status,
            "by_family": by_family, "by_route": by_route, "problems": problems, "slow": slow,
            "case_s": {"p50": percentile(times, 0.5), "p99": percentile(times, 0.99), "max": max(times or [0])},
            "health": health, "server_5xx": server_5xx,
            "ok": not problems and not slow and health == "ok" and server_5xx == 0 and "500" not in by_status}


def start_in_process(engine: str):
    """(url, model id, stop) of a server in this process: the scripted engine or the tiny model."""
    from live_server import MODEL_NAMES, LiveServer, make_fake

    from freetoken.server.app import create_app
    from freetoken.server.generation import GenerationService
    from freetoken.server.server_state import ServerSettings
    if engine == "fake":
        _, svc, app = make_fake(max_body_bytes=32 << 20)
        srv = LiveServer(app)
        return srv.url, MODEL_NAMES[0], srv.stop
    from freetoken import LLM
    from freetoken.tiny import make_tiny
    d = make_tiny("qwen3_moe", Path(tempfile.mkdtemp()) / "tiny", max_position_embeddings=4096)
    llm = LLM(str(d), dtype="float32", max_model_len=4096, max_num_seqs=8, kv_cache_gib=0.25)
    svc = GenerationService(llm.engine, model_name=MODEL_NAMES[0], architecture="Qwen3MoeForCausalLM",
                            max_running=8, max_waiting=64, max_tokens_cap=8)
    app = create_app(svc, ServerSettings(model_names=MODEL_NAMES, max_body_bytes=32 << 20, admin_token=ADMIN_TOKEN))
    srv = LiveServer(app)

    def stop():
        srv.stop()
        llm.close()
    return srv.url, MODEL_NAMES[0], stop


def print_report(r: dict, label: str) -> None:
    print(f"fuzz_api ({label}): {r['cases']} cases in {r['elapsed_s']} s; by status: {dict(sorted(r['by_status'].items()))}")
    print(f"  per case: p50 {r['case_s']['p50'] * 1000:.0f} ms, p99 {r['case_s']['p99'] * 1000:.0f} ms, "
          f"max {r['case_s']['max'] * 1000:.0f} ms; over the limit: {len(r['slow'])}")
    print("  by family:")
    for k, v in sorted(r["by_family"].items()):
        print(f"    {k}: {dict(sorted(v.items()))}")
    print("  by route:")
    for k, v in sorted(r["by_route"].items()):
        print(f"    {k}: {dict(sorted(v.items()))}")
    print(f"  server 5xx counted: {r['server_5xx']:.0f}; /health: {r['health']}; problems: {len(r['problems'])}")
    for p in r["problems"][:15]:
        print("  PROBLEM", p)
    for s in r["slow"][:10]:
        print("  SLOW", s)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=3000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engine", choices=["tiny", "fake"], default="tiny")
    p.add_argument("--case-limit", type=float, default=1.0, help="seconds a case may take")
    p.add_argument("--canary", action="store_true", help="child-process server, canary stream gaps, RSS per case")
    p.add_argument("--rss-pct", type=float, default=5.0, help="with --canary: RSS after a case vs before")
    p.add_argument("--files", type=int, default=0, help="seeded bad-file mutations to run as well")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    ok = True
    out = {}
    if args.cases and args.canary:
        from fuzz_canary import run_canary
        r = run_canary(args.cases, args.seed, args.case_limit, args.rss_pct)
        print_report(r, f"canary, tiny model in a child process, seed {args.seed}")
        from fuzz_canary import print_canary
        print_canary(r)
        ok &= r["ok"] and r["canary"]["ok"]
        out["api"] = r
    elif args.cases:
        url, model, stop = start_in_process(args.engine)
        try:
            r = run_cases(url, generate(args.seed, args.cases, model, admin=args.engine == "tiny"), args.case_limit)
        finally:
            stop()
        print_report(r, f"{args.engine} engine in this process, seed {args.seed}")
        ok &= r["ok"]
        out["api"] = r
    if args.files:
        from fuzz_files import run_files
        f = run_files(args.files, args.seed)
        out["files"] = f
        ok &= f["ok"]
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    mp.set_start_method("spawn", force=True)
    os.environ.setdefault("TQDM_DISABLE", "1")
    sys.exit(main())
