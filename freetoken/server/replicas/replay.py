"""Replay agent sessions over HTTP (sessions concurrently, each one's turns in order) and
add up what the prefix caches served: the test and bench/replicas.py measure with it."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx


@dataclass
class ReplayTotals:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    failed: int = 0
    seconds: float = 0.0

    @property
    def prefilled(self) -> int:
        """Prompt tokens some replica had to compute (the cache did not have them)."""
        return self.prompt_tokens - self.cached_tokens


def session_bodies(sessions, turns: int, *, model: str = "m", max_tokens: int = 1,
                   with_session_id: bool = False) -> list[list[dict]]:
    """Chat-completion bodies per session (sim/sessions readers' Sessions), first `turns`."""
    out = []
    for s in sessions:
        bodies = []
        for r in s.requests[:turns]:
            b = {"model": model, "messages": r.messages, "max_tokens": max_tokens, "temperature": 0}
            if r.tools:
                b["tools"] = r.tools
            if with_session_id:
                b["user"] = s.name
            bodies.append(b)
        out.append(bodies)
    return out


def replay(url: str, sessions: list[list[dict]], *, timeout: float = 300.0) -> ReplayTotals:
    tot = ReplayTotals()

    def run(bodies):
        with httpx.Client(base_url=url, timeout=timeout) as c:
            for b in bodies:
                r = c.post("/v1/chat/completions", json=b)
                if r.status_code != 200:
                    tot.failed += 1
                    continue
                u = r.json()["usage"]
                tot.requests += 1
                tot.prompt_tokens += u["prompt_tokens"]
                tot.cached_tokens += (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max(1, len(sessions))) as ex:
        list(ex.map(run, sessions))
    tot.seconds = time.perf_counter() - t0
    return tot
