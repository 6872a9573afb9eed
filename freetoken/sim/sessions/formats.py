"""Read every agent-session format of ../shared/data/agent-sessions (see its SOURCES.md)
into Sessions: lists of (messages, tools, response) requests in the neutral chat format
the server renders (freetoken/server/chat.py), rebuilt by each framework's own rule.

| format | file | request rule |
|---|---|---|
| SWE-agent 1.0 `.traj` (`messages`) | `*.traj` | req 0 = traj[0].messages[:2]; req i = traj[i-1].messages (history processors applied) |
| SWE-agent 1.1 `.traj` (`query`) | `*.traj` | req i = traj[i].query, `cache_control` dropped; the autosubmit `[{}]` skipped |
| mini-swe-agent `.traj.json` | `*.traj.json` | req k = role+content of messages[:j_k], j_k = k-th assistant (reasoning never re-sent) |
| tau-bench | `*.json` list of {traj} | req k = traj[:j_k] (append-only) |
| OpenHands events | `*.jsonl` of {history} | events -> messages as ConversationMemory does; one request per model response |
| mitmproxy dump | `*.mitm` | each /chat/completions flow's body is a request; its response the reply |
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ...server.errors import BadRequest
from ...server.api.openai import openai_messages, openai_tools


class SessionError(ValueError):
    """A session file that cannot be read; the message names the file and the field."""


@dataclass
class Request:
    messages: list[dict]             # neutral messages, as the server would render them
    tools: list[dict] | None
    response: dict | None            # the assistant message the model answered with


@dataclass
class Session:
    name: str
    format: str
    requests: list[Request] = field(default_factory=list)


def _neutral(where: str, messages: list[dict]) -> list[dict]:
    wire = []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise SessionError(f"{where}: expected chat messages with a role, got {str(m)[:80]!r}")
        m = {k: v for k, v in m.items() if k in ("role", "content", "tool_calls", "tool_call_id", "name",
                                                    "reasoning_content", "reasoning")}
        if m.get("role") == "tool" and not m.get("tool_call_id"):
            m["tool_call_id"] = ""
        wire.append(m)
    try:
        return openai_messages(wire)
    except BadRequest as e:
        raise SessionError(f"{where}: {e}") from None


def _tools(where: str, tools) -> list[dict] | None:
    try:
        return openai_tools(tools) if tools else None
    except BadRequest as e:
        raise SessionError(f"{where}: {e}") from None


def _assistant(where: str, msg: dict | str | None) -> dict | None:
    if msg is None:
        return None
    if isinstance(msg, str):
        msg = {"role": "assistant", "content": msg}
    return _neutral(where, [dict(msg, role="assistant")])[0]


# ---- SWE-agent (.traj) -------------------------------------------------------------

def _swe_agent(path: Path, data: dict) -> list[Session]:
    steps = data.get("trajectory")
    if not isinstance(steps, list) or not steps:
        raise SessionError(f"{path}: trajectory: expected a non-empty list of steps")
    name = path.name.removesuffix(".traj")
    if all("query" in s for s in steps):                          # SWE-agent >= 1.1
        queries = [s["query"] for s in steps if s.get("query") and s["query"] != [{}]]
        reqs = []
        for i, q in enumerate(queries):
            msgs = [_swe_item(m) for m in q]
            nxt = queries[i + 1] if i + 1 < len(queries) else None
            resp = nxt[len(q)] if nxt and len(nxt) > len(q) and nxt[len(q)].get("role") == "assistant" else \
                {"role": "assistant", "content": steps[i].get("response", ""),
                 "tool_calls": steps[i].get("tool_calls")}
            reqs.append(Request(_neutral(f"{path}: trajectory query {i}", msgs), None,
                                _assistant(f"{path}: trajectory {i} response", _swe_item(resp))))
        return [Session(name, "swe-agent-1.1", reqs)]
    if not all("messages" in s for s in steps):
        raise SessionError(f"{path}: trajectory[*]: expected 'messages' (SWE-agent 1.0) or 'query' (1.1)")
    reqs = []
    for i, step in enumerate(steps):                              # SWE-agent 1.0
        hist = steps[0]["messages"][:2] if i == 0 else steps[i - 1]["messages"]
        msgs = [{"role": m["role"], "content": m.get("content")} for m in hist]
        reqs.append(Request(_neutral(f"{path}: trajectory[{i}].messages", msgs), None,
                            _assistant(f"{path}: trajectory[{i}].response", step.get("response", ""))))
    return [Session(name, "swe-agent-1.0", reqs)]


def _swe_item(m: dict) -> dict:
    """One SWE-agent 1.1 history item as sent on the wire (cache_control markers dropped)."""
    out = {"role": m.get("role"), "content": m.get("content")}
    if isinstance(out["content"], list):
        out["content"] = [{"type": "text", "text": p.get("text", "")} if isinstance(p, dict) else p
                          for p in out["content"]]
    if m.get("tool_calls"):
        out["tool_calls"] = m["tool_calls"]
    ids = m.get("tool_call_ids") or ([m["tool_call_id"]] if m.get("tool_call_id") else None)
    if m.get("role") == "tool":
        out["tool_call_id"] = ids[0] if ids else ""
    return out


# ---- mini-swe-agent (.traj.json) -----------------------------------------------------

def _mini_swe_agent(path: Path, data: dict) -> list[Session]:
    msgs = data.get("messages")
    if not isinstance(msgs, list):
        raise SessionError(f"{path}: messages: expected a list")
    reqs = []
    for j, m in enumerate(msgs):
        if m.get("role") != "assistant":
            continue
        sent = [{"role": x["role"], "content": x.get("content")} for x in msgs[:j]]
        reply = {"role": "assistant", "content": m.get("content")}
        choice = (((m.get("extra") or {}).get("response") or {}).get("choices") or [{}])[0]
        reasoning = (choice.get("message") or {}).get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            reply["reasoning_content"] = reasoning
        reqs.append(Request(_neutral(f"{path}: messages[:{j}]", sent), None,
                            _assistant(f"{path}: messages[{j}]", reply)))
    return [Session(data.get("instance_id") or path.name.removesuffix(".traj.json"), "mini-swe-agent", reqs)]


# ---- tau-bench ---------------------------------------------------------------------

def _append_only(where: str, traj: list[dict], tools=None) -> list[Request]:
    reqs = []
    for j, m in enumerate(traj):
        if isinstance(m, dict) and m.get("role") == "assistant":
            reqs.append(Request(_neutral(f"{where}[:{j}]", traj[:j]), _tools(where, tools),
                                _assistant(f"{where}[{j}]", m)))
    return reqs


def _tau_bench(path: Path, data: list) -> list[Session]:
    out = []
    for i, run in enumerate(data):
        if not isinstance(run, dict) or not isinstance(run.get("traj"), list):
            raise SessionError(f"{path}: [{i}].traj: expected a list of chat messages")
        name = f"task{run.get('task_id', i)}-trial{run.get('trial', 0)}"
        out.append(Session(name, "tau-bench", _append_only(f"{path}: [{i}].traj", run["traj"])))
    return out
