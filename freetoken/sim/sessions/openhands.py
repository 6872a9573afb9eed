"""OpenHands V0 event streams (`output.jsonl`: one run per line, `history` = events) to
the requests the agent sent, rebuilt the way its ConversationMemory turns events into
messages: the system action -> system message (with its tools), user messages -> user,
each model response (shared by the actions it produced) -> one assistant message with
its tool calls, each observation answering a tool call -> a tool message, other agent
messages -> assistant, error observations without a call -> user. Recall actions add no
message (no prompt extensions are recorded). One request per distinct model response:
the messages before it, answered by it."""
from __future__ import annotations

import json
from pathlib import Path

from .formats import Request, Session, SessionError, _assistant, _neutral, _tools


def _messages(where: str, events: list[dict]):
    """-> (tools, list of (messages-before, response message)) per model call."""
    msgs, tools, calls, seen = [], None, [], set()
    for e in events:
        if not isinstance(e, dict):
            raise SessionError(f"{where}: expected event objects, got {str(e)[:60]!r}")
        action, obs, src = e.get("action"), e.get("observation"), e.get("source")
        meta = e.get("tool_call_metadata") or {}
        args = e.get("args") or {}
        if action == "system":
            msgs.append({"role": "system", "content": args.get("content", e.get("message", ""))})
            tools = args.get("tools") or tools
        elif action and meta:
            resp = meta.get("model_response") or {}
            rid = resp.get("id")
            if rid in seen:
                continue
            seen.add(rid)
            choice = (resp.get("choices") or [{}])[0].get("message") or {}
            reply = {"role": "assistant", "content": choice.get("content") or "",
                     "tool_calls": choice.get("tool_calls") or None}
            calls.append((list(msgs), reply))
            msgs.append(reply)
        elif action == "message" and src == "user":
            msgs.append({"role": "user", "content": args.get("content", e.get("message", ""))})
        elif action == "message" and src == "agent":
            reply = {"role": "assistant", "content": args.get("content", e.get("message", ""))}
            calls.append((list(msgs), reply))
            msgs.append(reply)
        elif obs and meta:
            msgs.append({"role": "tool", "tool_call_id": meta.get("tool_call_id", ""),
                         "name": meta.get("function_name", ""), "content": e.get("content", "")})
        elif obs == "error":
            msgs.append({"role": "user", "content": e.get("content", e.get("message", ""))})
    return tools, calls


def read_openhands(path: Path, text: str) -> list[Session]:
    sessions = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            run = json.loads(line)
        except ValueError as e:
            raise SessionError(f"{path}:{n}: not JSON ({e})") from None
        if not isinstance(run, dict) or not isinstance(run.get("history"), list):
            raise SessionError(f"{path}:{n}: history: expected the OpenHands event list")
        where = f"{path}:{n}"
        tools, calls = _messages(where, run["history"])
        tools = _tools(f"{where} system tools", tools)
        reqs = [Request(_neutral(f"{where} request {i}", m), tools, _assistant(f"{where} response {i}", r))
                for i, (m, r) in enumerate(calls)]
        sessions.append(Session(str(run.get("instance_id") or f"{path.stem}-{n}"), "openhands", reqs))
    return sessions
