"""`fuzz_api.py --canary`: does a bad request hurt the others? The server runs as `freetoken
serve` on the tiny model in a child process; another process streams a canary chat request
after another and writes the time of each content event. Each case (the probe's heavy
bodies first, then the seeded fuzz cases) is sent alone; the canary's largest inter-token
gap that overlaps the case and the server's RSS once the case is answered (against just
before it) are taken per case. Targets: gap <= 1 s, RSS back within --rss-pct (5%)."""
from __future__ import annotations

import json
import multiprocessing as mp
import tempfile
import time
from pathlib import Path

GAP_LIMIT_S = 1.0


def canary(url: str, model: str, out: str, stop) -> None:
    """In a child process: stream canary requests until stop is set; 'R t' at each request's
    start, 'T t' at each content event (time.monotonic is one clock for every process)."""
    import httpx
    body = {"model": model, "stream": True, "max_tokens": 64, "temperature": 1.0,
            "messages": [{"role": "user", "content": "count slowly from one to a thousand"}]}
    with open(out, "w", buffering=1) as f, httpx.Client(timeout=60, headers={"host": "127.0.0.1"}) as c:
        while not stop.is_set():
            f.write(f"R {time.monotonic()}\n")
            try:
                with c.stream("POST", url + "/v1/chat/completions", json=body) as r:
                    for line in r.iter_lines():
                        if line.startswith("data: {") and '"content"' in line:
                            f.write(f"T {time.monotonic()}\n")
            except httpx.HTTPError as e:
                f.write(f"E {time.monotonic()} {type(e).__name__}\n")
                time.sleep(0.2)


class CanaryLog:
    """The canary's events read back; gaps only within one request, after its first token
    (the first one waits for the prompt's prefill, which is not a decode gap)."""

    def __init__(self, path: str):
        self.path, self.pos, self.gaps, self.last_t, self.prev = path, 0, [], 0.0, None

    def poll(self) -> None:
        with open(self.path) as f:
            f.seek(self.pos)
            chunk = f.read()
        cut = chunk.rfind("\n") + 1
        self.pos += len(chunk[:cut].encode())
        for line in chunk[:cut].splitlines():
            kind, t = line.split()[:2]
            t = float(t)
            if kind == "T":
                if self.prev is not None:
                    self.gaps.append((self.prev, t))
                self.prev = t
                self.last_t = t
            else:
                self.prev = None

    def wait_past(self, t: float, limit: float = 10.0) -> None:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            self.poll()
            if self.last_t > t:
                return
            time.sleep(0.02)

    def max_gap(self, t0: float, t1: float) -> float:
        return max((b - a for a, b in self.gaps if a < t1 and b > t0), default=float("nan"))


def run_canary(n: int, seed: int, case_limit: float, rss_pct: float) -> dict:
    from soak import Server, rss_mib

    from fuzz_api import ADMIN_TOKEN, run_cases
    from fuzz_cases import generate, probe_cases
    server = Server(clients=8, max_running=8, extra_args=("--admin-token", ADMIN_TOKEN, "--max-tokens-cap", "64"))
    import httpx
    model = httpx.get(server.url + "/v1/models", headers={"host": "127.0.0.1"}).json()["data"][0]["id"]
    log_path = str(Path(tempfile.gettempdir()) / f"fuzz-canary-{server.proc.pid}.log")
    stop = mp.Event()
    proc = mp.Process(target=canary, args=(server.url, model, log_path, stop), daemon=True)
    proc.start()
    log = None
    per_case: list[dict] = []
    try:
        deadline = time.monotonic() + 120
        while log is None and time.monotonic() < deadline:
            if Path(log_path).exists():
                log = CanaryLog(log_path)
            time.sleep(0.1)
        if log is None:
            raise SystemExit("the canary process never started streaming")
        log.wait_past(time.monotonic() + 1.0, 60)     # the canary streams before the first case
        rss_start = rss_mib(server.proc.pid)
        state = {}

        def before(i):
            log.poll()
            state["rss"] = rss_mib(server.proc.pid)

        def on_case(i, case, t0, t1):
            log.wait_past(t1 + 0.05)
            gap = log.max_gap(t0, t1)
            settle_deadline = time.monotonic() + 3.0
            rss = rss_mib(server.proc.pid)
            while rss > state["rss"] * (1 + rss_pct / 100) and time.monotonic() < settle_deadline:
                time.sleep(0.1)
                rss = rss_mib(server.proc.pid)
            per_case.append({"i": i, "family": case.family, "route": case.route, "seconds": round(t1 - t0, 3),
                             "canary_gap_s": round(gap, 3), "rss_before": state["rss"], "rss_after": rss,
                             "rss_pct": round(100 * (rss - state["rss"]) / state["rss"], 2)})
            before(i + 1)

        cases = probe_cases(model) + generate(seed, n, model)
        before(0)
        r = run_cases(server.url, cases, case_limit, on_case=on_case)
        rss_end = rss_mib(server.proc.pid)
    finally:
        stop.set()
        proc.join(90)
        if proc.is_alive():
            proc.terminate()
        rc = server.stop()
    gaps = [c["canary_gap_s"] for c in per_case if c["canary_gap_s"] == c["canary_gap_s"]]
    over_gap = [c for c in per_case if c["canary_gap_s"] > GAP_LIMIT_S]
    over_rss = [c for c in per_case if c["rss_pct"] > rss_pct]
    all_gaps = sorted(b - a for a, b in log.gaps)
    r["canary"] = {
        "cases_measured": len(gaps), "max_gap_s": max(gaps, default=float("nan")),
        "gap_p50_s": all_gaps[len(all_gaps) // 2] if all_gaps else float("nan"),
        "gap_p99_s": all_gaps[min(len(all_gaps) - 1, int(0.99 * len(all_gaps)))] if all_gaps else float("nan"),
        "over_gap": over_gap, "over_rss": over_rss, "rss_start": rss_start, "rss_end": rss_end,
        "probe": [c for c in per_case if c["family"].startswith("probe-")], "server_rc": rc,
        "ok": not over_gap and not over_rss and rc == 0,
    }
    r["per_case"] = per_case
    Path(log_path).unlink(missing_ok=True)
    return r


def print_canary(r: dict) -> None:
    c = r["canary"]
    print(f"canary: {c['cases_measured']} cases measured; its largest inter-token gap during a case "
          f"{c['max_gap_s'] * 1000:.0f} ms (limit {GAP_LIMIT_S * 1000:.0f}); all its gaps p50 "
          f"{c['gap_p50_s'] * 1000:.0f} ms, p99 {c['gap_p99_s'] * 1000:.0f} ms")
    print(f"  cases with a gap over the limit: {len(c['over_gap'])}; with RSS not back within the bound: "
          f"{len(c['over_rss'])}; server RSS {c['rss_start']:.0f} -> {c['rss_end']:.0f} MiB over the run; "
          f"server exit {c['server_rc']}")
    print("  probe cases (status is in by_family):")
    for p in c["probe"]:
        st = r["by_family"].get(p["family"], {})
        print(f"    {p['family'][6:]:28s} {json.dumps(st):14s} {p['seconds']:6.2f} s  canary gap "
              f"{p['canary_gap_s'] * 1000:5.0f} ms  RSS {p['rss_before']:.0f} -> {p['rss_after']:.0f} MiB "
              f"({p['rss_pct']:+.1f}%)")
    for p in c["over_gap"][:10]:
        print(f"  GAP {p}")
    for p in c["over_rss"][:10]:
        print(f"  RSS {p}")
