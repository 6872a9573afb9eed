"""Recorded agent sessions (../shared/data/agent-sessions) as turns to replay: each turn is the
messages an agent sent and the response the model gave. The bench forces the responses as
outputs (so a drafter's acceptance is its real acceptance on real text) and the tests measure
the suffix drafter against a brute-force one on them."""
from __future__ import annotations

import json
from pathlib import Path


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):           # [{"type": "text", "text": ...}, ...]
        return "".join(c.get("text", "") if isinstance(c, dict) else str(c) for c in content)
    return str(content)


def render(messages: list[dict]) -> str:
    """ChatML text of a conversation, tool calls as JSON: the prompt the next response follows."""
    out = []
    for m in messages:
        body = _text(m.get("content"))
        if m.get("tool_calls"):
            body += json.dumps(m["tool_calls"])
        out.append(f"<|im_start|>{m.get('role', 'user')}\n{body}<|im_end|>\n")
    return "".join(out) + "<|im_start|>assistant\n"


def _assistant_text(m: dict) -> str:
    return _text(m.get("content")) + (json.dumps(m["tool_calls"]) if m.get("tool_calls") else "")


def load_sessions(root: str | Path, max_sessions: int | None = None, max_turns: int | None = None,
                  names: set[str] | None = None) -> list[tuple[str, list[tuple[str, str]]]]:
    """[(session name, [(prompt text, response text) per turn])] from the SWE-agent trajectories
    (`*.traj`: each step's `messages` and `response`) and tau-bench (`*.json`: each assistant
    message after the ones before it). `names`: only the sessions so named."""
    root = Path(root)
    sessions = []
    for path in sorted(root.glob("*/*.traj")):
        if names is not None and path.stem not in names:
            continue
        traj = json.loads(path.read_text())
        steps, history = traj["trajectory"], traj["history"]
        # a step's `messages` are what the agent sent after it (they end with its observation):
        # the prompt of step i's response is step i-1's messages, the first one the history's head
        first = next(j for j, m in enumerate(history) if m["role"] == "assistant")
        prompts = [history[:first]] + [s["messages"] for s in steps[:-1]]
        turns = [(render(m), s["response"]) for m, s in zip(prompts, steps) if m and s.get("response")]
        sessions.append((path.stem, turns[:max_turns]))
    for path in sorted(root.glob("tau-bench*/*.json")):
        for i, run in enumerate(json.loads(path.read_text())):
            if names is not None and f"{path.stem}-{i}" not in names:
                continue
            msgs = run["traj"]
            turns = [(render(msgs[:j]), _assistant_text(m)) for j, m in enumerate(msgs)
                     if m.get("role") == "assistant" and _assistant_text(m)]
            sessions.append((f"{path.stem}-{i}", turns[:max_turns]))
    return sessions[:max_sessions]


def tokens_per_verify(drafter, sessions_ids, k: int) -> tuple[float, int, int]:
    """Replay sessions of (prompt ids, response ids) turns through a drafter with the responses
    forced: each verify step accepts the drafted tokens that match the response and adds one.
    Returns (output tokens per verify step, output tokens, verify steps)."""
    steps = tokens = 0
    for s, turns in enumerate(sessions_ids):
        for t, (prompt, resp) in enumerate(turns):
            key = (s, t)
            pos = 0
            while pos < len(resp):
                ctx = prompt + resp[:pos]
                drafter.observe(key, ctx, 0)
                d = drafter.propose(ctx, k, key=key)
                acc = 0
                if d is not None:
                    for a, b in zip(d.tokens, resp[pos:]):
                        if a != b:
                            break
                        acc += 1
                pos += min(acc + 1, len(resp) - pos)
                steps += 1
            drafter.observe(key, prompt + resp, 0)
            drafter.forget(key)
            tokens += len(resp)
    return tokens / max(steps, 1), tokens, steps
