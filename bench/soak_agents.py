"""Agent-like soak traffic: the recorded agent sessions of /work/shared/data/agent-sessions
(SWE-agent, tau-bench, OpenHands; read by freetoken.sim.sessions) replayed turn after turn
as streamed chat requests with their tools, each message cut to fit the tiny model's
context. Each soak client walks its own session in order, so consecutive turns share their
prefix as an agent's do (the prefix cache sees agent-shaped reuse)."""
from __future__ import annotations

import json
import os
import random
from functools import lru_cache
from pathlib import Path

_FOUND = next((p / "shared/data/agent-sessions" for p in Path(__file__).resolve().parents
               if (p / "shared/data/agent-sessions").is_dir()), Path("shared/data/agent-sessions"))
SESSIONS = Path(os.environ.get("FREETOKEN_AGENT_SESSIONS", _FOUND))   # the checkout's ../shared
MESSAGE_CHARS = 300          # each message cut to this (tiny model: 4096 positions)
KEEP_HEAD, KEEP_TAIL = 2, 6  # the system prompt and task, then the latest turns
TOOL_CHARS = 2000            # the tools' JSON at most (a prompt stays under ~2,500 tokens)


@lru_cache(maxsize=1)
def agent_requests() -> tuple[tuple[list[dict], list[dict] | None], ...]:
    """Every turn of every session, (messages, tools), sessions in a fixed order."""
    from freetoken.server.replicas.replay import session_bodies
    from freetoken.sim.sessions import read_sessions
    folders = [SESSIONS / d for d in ("tau-bench_gpt-4o-airline", "openhands-0.x_llama-4-maverick_events",
                                      "swe-agent-1.0.1_selfhosted-lastn5") if (SESSIONS / d).is_dir()]
    if not folders:
        raise SystemExit(f"no agent sessions under {SESSIONS} (set FREETOKEN_AGENT_SESSIONS)")
    sessions = session_bodies(read_sessions(folders), 40)
    return tuple(tuple((b["messages"], b.get("tools")) for b in s) for s in sessions if s)


def _cut(m: dict) -> dict:
    m = dict(m)
    for k in ("content", "reasoning_content"):
        if isinstance(m.get(k), str):
            m[k] = m[k][:MESSAGE_CHARS]
    if m.get("tool_calls"):            # long arguments (file edits) become a short JSON object
        m["tool_calls"] = [_cut_call(c) for c in m["tool_calls"]]
    if isinstance(m.get("content"), list):
        m["content"] = [dict(p, text=p["text"][:MESSAGE_CHARS]) if isinstance(p.get("text"), str) else p
                        for p in m["content"]][:4]
    return m


def _cut_call(c: dict) -> dict:
    fn = c.get("function") or {}
    args = fn.get("arguments")
    text = args if isinstance(args, str) else json.dumps(args)
    if len(text) <= MESSAGE_CHARS:
        return c
    return {**c, "function": {**fn, "arguments": json.dumps({"cut": text[:MESSAGE_CHARS]})}}


def trimmed(messages: list[dict]) -> list[dict]:
    """The head and the latest turns; the tail starts at a user message so no tool result is
    left without the call it answers."""
    if len(messages) <= KEEP_HEAD + KEEP_TAIL:
        return [_cut(m) for m in messages]
    tail = messages[-KEEP_TAIL:]
    while tail and tail[0].get("role") != "user":
        tail = tail[1:]
    return [_cut(m) for m in messages[:KEEP_HEAD] + (tail or messages[-1:])]


class AgentWalk:
    """One client's walk: a session's turns in order, then another session."""

    def __init__(self, rng: random.Random):
        self.rng, self.turns, self.i = rng, (), 0

    def next_body(self, model: str, max_tokens: int) -> dict:
        if self.i >= len(self.turns):
            self.turns, self.i = self.rng.choice(agent_requests()), 0
        messages, tools = self.turns[self.i]
        self.i += 1
        body = {"model": model, "messages": trimmed(messages), "max_tokens": max_tokens, "stream": True,
                "stream_options": {"include_usage": True}}
        kept, size = [], 0
        for t in tools or []:          # the tools that fit TOOL_CHARS, in their order
            size += len(json.dumps(t))
            if size > TOOL_CHARS:
                break
            kept.append(t)
        if kept:
            body["tools"] = kept
        return body
