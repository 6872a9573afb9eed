"""Soak: N concurrent streaming clients against a live FreeToken server on loopback for a
set time, then end-of-run checks. Mixed traffic: OpenAI chat (some with tools), the
Responses API, Anthropic messages (some with tools), JSON-schema outputs, and a third of the
turns from recorded agent sessions (bench/soak_agents.py, each client walking a session); ~10% of streams
are dropped by their client mid-stream; ~10% of turns send a second request at once so the
queue limit is passed and some requests get 429.

Reports requests by outcome, errors by class, p50/p99 TTFT and inter-token latency, RSS and
KV blocks in use sampled every few seconds. Checks at the end: every request accounted for
(completed, rejected with 429, or cancelled by its own client), no 5xx, KV blocks back to
idle, RSS growth after warm-up under a bound. Exit 0 when every check passes.

Without --url it starts `freetoken serve` on a random-weight tiny model (built once in
~/.cache/freetoken/bench). Only 127.0.0.1 / localhost / ::1 is ever contacted.

    python bench/soak.py                                      # 32 clients x 10 minutes, the target
    python bench/soak.py --clients 8 --minutes 3              # shorter
    python bench/soak.py --clients 8 --duration 25 --sample-every 2   # about what CI runs
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
from soak_agents import AgentWalk, agent_requests  # noqa: E402
from soak_clients import KINDS, Outcome, one_request  # noqa: E402

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
ROOT = Path(__file__).resolve().parents[1]


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def rss_mib(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def scrape(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = out.get(name, 0.0) + float(value)
            except ValueError:
                pass
    return out


def metric_sum(m: dict[str, float], prefix: str, contains: str = "") -> float:
    return sum(v for k, v in m.items() if k.startswith(prefix) and contains in k)


class Server:
    """`freetoken serve` on the tiny model in a child process (loopback, random port)."""

    def __init__(self, clients: int, max_running: int, extra_args: tuple[str, ...] = ()):
        from freetoken.tiny import make_tiny
        cache = Path(os.environ.get("FREETOKEN_BENCH_CACHE", Path.home() / ".cache/freetoken/bench"))
        model = cache / "soak-tiny-qwen3-moe"
        if not (model / "config.json").is_file():
            make_tiny("qwen3_moe", model, max_position_embeddings=4096)
        waiting = max(1, clients - max_running)     # a burst of doubles passes the limit: 429s
        cmd = [sys.executable, "-m", "freetoken.cli", "serve", "--model", str(model), "--host",
               "127.0.0.1", "--port", "0", "--dtype", "float32", "--max-model-len", "4096",
               "--max-running-requests", str(max_running), "--max-waiting-requests", str(waiting),
               "--engine-option", "kv_cache_gib=0.25", "--log-level", "warning", *extra_args]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.url, self.log = None, []
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and self.url is None:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.log.append(line)
            if line.startswith("READY "):
                self.url = line.split()[1]
        if self.url is None:
            self.proc.kill()
            raise SystemExit("the server did not start:\n" + "".join(self.log[-20:]))
        threading.Thread(target=self._read_log, daemon=True).start()

    def _read_log(self):
        for line in self.proc.stdout:
            self.log.append(line)

    def stop(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -9


async def sampler(client, url: str, pid: int | None, samples: list, stop: asyncio.Event, every: float):
    t0 = time.monotonic()
    while not stop.is_set():
        try:
            m = scrape((await client.get(url + "/metrics", timeout=10)).text)
            samples.append({"t": round(time.monotonic() - t0, 1), "rss_mib": rss_mib(pid),
                            "kv_blocks_in_use": m.get("freetoken_kv_blocks_in_use"),
                            "running": m.get("freetoken_requests_running"),
                            "waiting": m.get("freetoken_requests_waiting")})
        except Exception as e:  # noqa: BLE001 - a missed sample is reported, not fatal
            samples.append({"t": round(time.monotonic() - t0, 1), "error": repr(e)})
        try:
            await asyncio.wait_for(stop.wait(), every)
        except asyncio.TimeoutError:
            pass


def stall_phase_on(t: float, t0: float, phase: float) -> bool:
    """With --stall-phase, the stalled readers are connected in the odd phases only."""
    return phase > 0 and int((t - t0) // phase) % 2 == 1


async def stalled_reader(url: str, model: str, deadline: float, api_key: str | None,
                         t0: float = 0.0, phase: float = 0.0):
    """A client that sends a streaming request and never reads a byte of the reply (tiny
    receive buffer); it reconnects every 40 s until the run ends. With `phase`, it is
    connected only during the odd phases of that length (the even ones run without it)."""
    import socket
    host, port = urlparse(url).hostname, urlparse(url).port
    body = json.dumps({"model": model, "stream": True, "max_tokens": 100_000,
                       "messages": [{"role": "user", "content": "tell me a very long story"}]}).encode()
    auth = f"Authorization: Bearer {api_key}\r\n".encode() if api_key else b""
    while time.monotonic() < deadline:
        hold = 40.0
        if phase:
            k = int((time.monotonic() - t0) // phase)
            if k % 2 == 0:                          # a phase without stalled readers
                await asyncio.sleep(max(0.0, min(deadline, t0 + (k + 1) * phase) - time.monotonic()))
                continue
            hold = t0 + (k + 1) * phase - time.monotonic()
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(s, (host, port))
        await loop.sock_sendall(s, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth +
                                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                % (len(body), body))
        await asyncio.sleep(min(hold, max(0.0, deadline - time.monotonic())))
        s.close()


async def client_loop(i: int, client, url: str, deadline: float, budget: list[int], rng: random.Random,
                      outcomes: list[Outcome], model: str, kinds: dict):
    walk = AgentWalk(rng)
    while time.monotonic() < deadline and budget[0] > 0:
        budget[0] -= 1
        kind = rng.choices(list(kinds), weights=[w for w, _ in kinds.values()])[0]
        drop = rng.random() < 0.10
        double = rng.random() < 0.10
        max_tokens = rng.randint(8, 48)
        body = walk.next_body(model, max_tokens) if kind == "chat_agent" else None
        jobs = [one_request(client, url, kind, model, max_tokens, drop, rng.randint(1, 4), body)]
        if double:
            budget[0] -= 1
            jobs.append(one_request(client, url, "chat", model, 8, False, 0))
        done = await asyncio.gather(*jobs)
        outcomes += done
        if any(o.status == "rejected" for o in done):      # as a client should: honour Retry-After
            await asyncio.sleep(max(o.retry_after or 1.0 for o in done) * rng.uniform(0.5, 1.5))


async def run(args) -> dict:
    import httpx
    server = None
    if args.url:
        host = urlparse(args.url).hostname
        if host not in LOOPBACK:
            raise SystemExit(f"--url must be a loopback address ({', '.join(sorted(LOOPBACK))}), got {host}")
        url, pid = args.url.rstrip("/"), args.pid
    else:
        server = Server(args.clients, args.max_running, ("--speculative", args.speculative))
        url, pid = server.url, server.proc.pid
    limits = httpx.Limits(max_connections=args.clients * 3, max_keepalive_connections=args.clients * 2)
    outcomes: list[Outcome] = []
    samples: list[dict] = []
    async with httpx.AsyncClient(limits=limits, timeout=args.request_timeout,
                                 headers={"Authorization": f"Bearer {args.api_key}"} if args.api_key else None) as client:
        model = (await client.get(url + "/v1/models")).json()["data"][0]["id"]
        if args.agents:
            try:
                agent_requests()              # read the sessions before the clock starts
            except SystemExit as e:           # a checkout without shared/data: plain turns only
                print(f"soak: {e}; running without agent turns", file=sys.stderr)
                args.agents = False
        kinds = {k: (args.weights.get(k, w), d) for k, (w, d) in KINDS.items()
                 if args.agents or k != "chat_agent"}
        before = scrape((await client.get(url + "/metrics")).text)
        idle_kv = before.get("freetoken_kv_blocks_in_use", 0.0)
        stop = asyncio.Event()
        sample_task = asyncio.ensure_future(sampler(client, url, pid, samples, stop, args.sample_every))
        t0 = time.monotonic()
        deadline = t0 + args.duration
        budget = [args.max_requests]
        rng = random.Random(args.seed)
        stalled = [asyncio.ensure_future(stalled_reader(url, model, deadline, args.api_key, t0, args.stall_phase))
                   for _ in range(args.stalled)]
        await asyncio.gather(*(client_loop(i, client, url, deadline, budget, random.Random(rng.random()),
                                           outcomes, model, kinds) for i in range(args.clients)))
        await asyncio.gather(*stalled)
        elapsed = time.monotonic() - t0
        settle = time.monotonic() + 15      # cancelled requests leave the engine within a step or two
        while True:
            after = scrape((await client.get(url + "/metrics")).text)
            busy = after.get("freetoken_requests_running", 0) + after.get("freetoken_requests_waiting", 0)
            if (after.get("freetoken_kv_blocks_in_use", 0) <= idle_kv and not busy) or time.monotonic() > settle:
                break
            await asyncio.sleep(0.25)
        stop.set()
        await sample_task
        samples.append({"t": round(time.monotonic() - t0, 1), "rss_mib": rss_mib(pid),
                        "kv_blocks_in_use": after.get("freetoken_kv_blocks_in_use"), "final": True})
    rc = server.stop() if server else None
    r = report(args, outcomes, samples, before, after, idle_kv, elapsed, rc, server)
    if args.stall_phase:                # inter-token gaps split by the phase they ended in
        split = {True: [], False: []}
        for o in outcomes:
            for g, end in zip(o.gaps, o.gap_ends):
                split[stall_phase_on(end, t0, args.stall_phase)].append(g)
        r["itl_by_phase_s"] = {name: {"p50": percentile(split[on], 0.5), "p99": percentile(split[on], 0.99),
                                      "n": len(split[on])}
                               for name, on in (("without_stalled", False), ("with_stalled", True))}
    return r


def report(args, outcomes, samples, before, after, idle_kv, elapsed, rc, server) -> dict:
    by = {}
    for o in outcomes:
        by[o.status] = by.get(o.status, 0) + 1
    errors = {}
    for o in outcomes:
        if o.status == "error":
            errors[o.error] = errors.get(o.error, 0) + 1
    ttft = [o.ttft for o in outcomes if o.ttft is not None]
    itl = [g for o in outcomes for g in o.gaps]
    rss = [s["rss_mib"] for s in samples if s.get("rss_mib")]
    warm = [s["rss_mib"] for s in samples if s.get("rss_mib") and s["t"] >= args.warmup] or rss
    growth = (100.0 * (rss[-1] - warm[0]) / warm[0]) if len(warm) > 1 else 0.0
    at2 = next((s["rss_mib"] for s in samples if s.get("rss_mib") and s["t"] >= 120), None)
    server_5xx = metric_sum(after, "freetoken_http_errors", 'status="5') - \
        metric_sum(before, "freetoken_http_errors", 'status="5')
    cancelled_srv = metric_sum(after, "freetoken_requests_total", "cancelled") - \
        metric_sum(before, "freetoken_requests_total", "cancelled")
    accounted = by.get("completed", 0) + by.get("rejected", 0) + by.get("cancelled", 0)
    checks = {
        "every request accounted for (completed, 429, or cancelled by its client)":
            accounted == len(outcomes) and not errors,
        "no 5xx (client side and server /metrics)": server_5xx == 0 and not any(
            o.http_status and o.http_status >= 500 for o in outcomes),
        "KV blocks back to idle": (after.get("freetoken_kv_blocks_in_use", 0) <= idle_kv
                                   and not after.get("freetoken_requests_running")),
        f"RSS growth after warm-up < {args.rss_growth_pct}%": growth < args.rss_growth_pct,
    }
    if at2 and elapsed > 150:
        checks[f"RSS at the end within {args.rss_2min_pct}% of minute 2"] = \
            abs(rss[-1] / at2 - 1) * 100 <= args.rss_2min_pct
    if server is not None:
        checks["server exits 0 on SIGTERM"] = rc == 0
        checks["no traceback in the server log"] = not any("Traceback" in ln for ln in server.log)
    return {
        "command": " ".join(sys.argv), "clients": args.clients, "stalled_readers": args.stalled,
        "duration_s": round(elapsed, 1),
        "requests": len(outcomes), "outcomes": by, "errors_by_class": errors,
        "server_counted_cancelled": cancelled_srv,
        "ttft_s": {"p50": percentile(ttft, 0.5), "p99": percentile(ttft, 0.99)},
        "itl_s": {"p50": percentile(itl, 0.5), "p99": percentile(itl, 0.99)},
        "tokens_streamed": sum(o.events for o in outcomes),
        "rss_mib": {"first": rss[0] if rss else None, "after_warmup": warm[0] if warm else None,
                    "last": rss[-1] if rss else None, "growth_pct": round(growth, 2), "minute_2": at2,
                    "end_vs_minute_2": round(rss[-1] / at2, 4) if at2 and rss else None},
        "kv_blocks_in_use": {"idle": idle_kv, "max": max((s.get("kv_blocks_in_use") or 0) for s in samples),
                             "end": after.get("freetoken_kv_blocks_in_use")},
        "problems": [o.detail for o in outcomes if o.detail][:20],
        "samples": samples, "checks": checks, "ok": all(checks.values()),
    }


def print_report(r: dict) -> None:
    print(f"soak: {r['clients']} clients (+{r['stalled_readers']} that never read), {r['duration_s']} s, {r['requests']} requests: {r['outcomes']}")
    if r["errors_by_class"]:
        print(f"  errors by class: {r['errors_by_class']}")
    for d in r.get("problems", []):
        print(f"  problem: {d}")
    print(f"  server counted cancelled: {r['server_counted_cancelled']:.0f}; streamed events: {r['tokens_streamed']}")
    print(f"  TTFT p50 {r['ttft_s']['p50']:.3f} s  p99 {r['ttft_s']['p99']:.3f} s;  "
          f"inter-token p50 {r['itl_s']['p50'] * 1000:.1f} ms  p99 {r['itl_s']['p99'] * 1000:.1f} ms")
    rs = r["rss_mib"]
    if rs["first"]:
        print(f"  RSS MiB: first {rs['first']:.0f}, after warm-up {rs['after_warmup']:.0f}, "
              f"last {rs['last']:.0f} ({rs['growth_pct']:+.2f}%)")
    if rs["minute_2"]:
        print(f"  RSS at minute 2 {rs['minute_2']:.0f} MiB, at the end {rs['last']:.0f} MiB: "
              f"end / minute 2 = {rs['end_vs_minute_2']:.3f}")
    kv = r["kv_blocks_in_use"]
    print(f"  KV blocks in use: idle {kv['idle']:.0f}, max {kv['max']:.0f}, end {kv['end']:.0f}")
    for name, ok in r["checks"].items():
        print(f"  [{'PASS' if ok else 'FAIL'}] {name}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=None, help="a running server on loopback (default: start one)")
    p.add_argument("--pid", type=int, default=None, help="with --url: the server's pid, to sample its RSS")
    p.add_argument("--api-key", default=None)
    p.add_argument("--stalled", type=int, default=0, help="extra clients that never read their stream")
    p.add_argument("--stall-phase", type=float, default=0.0, help="with --stalled: connect the stalled "
                   "readers only in alternate phases of this many seconds (side-by-side comparison)")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load (at most 3600)")
    p.add_argument("--minutes", type=float, default=None, help="minutes of load (sets --duration)")
    p.add_argument("--no-agents", dest="agents", action="store_false",
                   help="leave the recorded agent sessions' turns out of the mix")
    p.add_argument("--max-requests", type=int, default=100_000, help="stop after this many requests")
    p.add_argument("--max-running", type=int, default=8, help="the started server's --max-running-requests")
    # the suffix drafter's index grows by design to its bound (engine/spec/suffix.py MAX_TOKENS,
    # ~200 MB): a leak check of a short soak would read that as growth, so the default soaks without it
    p.add_argument("--speculative", default="off", help="the started server's --speculative (default off)")
    p.add_argument("--request-timeout", type=float, default=120.0)
    p.add_argument("--sample-every", type=float, default=10.0, help="seconds between RSS / KV samples")
    p.add_argument("--warmup", type=float, default=None, help="seconds before RSS growth is measured "
                   "(default: a fifth of the duration)")
    p.add_argument("--rss-growth-pct", type=float, default=5.0)
    p.add_argument("--rss-2min-pct", type=float, default=10.0, help="RSS at the end vs at minute 2")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weight", action="append", default=[], metavar="KIND=N",
                   help=f"a request kind's weight in the mix (kinds: {', '.join(KINDS)}; e.g. "
                        "json_schema=6 to soak constrained output harder)")
    p.add_argument("--json", default=None, help="also write the report (with all samples) here")
    args = p.parse_args(argv)
    args.weights = {}
    for w in args.weight:
        kind, _, n = w.partition("=")
        if kind not in KINDS or not n.isdigit():
            p.error(f"--weight {w!r}: expected KIND=N with KIND one of {', '.join(KINDS)}")
        args.weights[kind] = int(n)
    if args.minutes is not None:
        args.duration = args.minutes * 60
    if not (1 <= args.clients <= 256 and 0 < args.duration <= 3600):
        p.error("--clients must be in 1..256 and --duration in (0, 3600]")
    if args.warmup is None:
        args.warmup = args.duration / 5
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    r = asyncio.run(run(args))
    print_report(r)
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1, default=str))
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
