"""Small session files in the held-back formats, written from their SOURCES.md descriptions
(mini-swe-agent .traj.json, SWE-agent 1.1 `query`, a mitmproxy dump), for reader tests."""
from __future__ import annotations

import json


def tnet(v) -> bytes:
    """tnetstring encoding (what mitmproxy's FlowWriter writes)."""
    if isinstance(v, bytes):
        return b"%d:%s," % (len(v), v)
    if isinstance(v, str):
        b = v.encode()
        return b"%d:%s;" % (len(b), b)
    if isinstance(v, bool):
        b = b"true" if v else b"false"
        return b"%d:%s!" % (len(b), b)
    if isinstance(v, int):
        b = str(v).encode()
        return b"%d:%s#" % (len(b), b)
    if v is None:
        return b"0:~"
    if isinstance(v, list):
        b = b"".join(tnet(x) for x in v)
        return b"%d:%s]" % (len(b), b)
    if isinstance(v, dict):
        b = b"".join(tnet(k.encode() if isinstance(k, str) else k) + tnet(x) for k, x in v.items())
        return b"%d:%s}" % (len(b), b)
    raise TypeError(v)


SYSTEM = "You are a helpful agent."
TASK = "Fix the bug in a.py."


def mini_swe_agent(path):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK},
            {"role": "assistant", "content": "THOUGHT: look\n```bash\nls\n```",
             "extra": {"response": {"choices": [{"message": {"reasoning": "list files first"}}]}}},
            {"role": "user", "content": "a.py b.py"},
            {"role": "assistant", "content": "THOUGHT: done\n```bash\necho COMPLETE\n```", "extra": {}}]
    path.write_text(json.dumps({"info": {"mini_version": "1.15.0"}, "messages": msgs,
                                "trajectory_format": "mini-swe-agent-1", "instance_id": "demo-1"}))
    return path


def swe_agent_11(path):
    call = {"id": "toolu_1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    q0 = [{"role": "system", "content": SYSTEM},
          {"role": "user", "content": [{"type": "text", "text": TASK, "cache_control": {"type": "ephemeral"}}]}]
    a0 = {"role": "assistant", "content": "Let me look.", "tool_calls": [call]}
    t0 = {"role": "tool", "content": [{"type": "text", "text": "a.py b.py", "cache_control": {"type": "ephemeral"}}],
          "tool_call_ids": ["toolu_1"]}
    q1 = [q0[0], {"role": "user", "content": [{"type": "text", "text": TASK}]}, a0, t0]
    steps = [{"query": q0, "response": "Let me look.", "thought": "", "action": "ls"},
             {"query": q1, "response": "Done.", "thought": "", "action": "submit"},
             {"query": [{}], "response": "", "thought": "", "action": "submit"}]
    path.write_text(json.dumps({"trajectory": steps, "history": [], "info": {}, "replay_config": "{}",
                                "environment": "x"}))
    return path


def mitm_dump(path):
    sys_msg = {"role": "system", "content": SYSTEM}
    user = {"role": "user", "content": TASK}
    flows = []

    def flow(messages, reply, sse=False):
        body = json.dumps({"model": "m", "messages": messages, "stream": sse}).encode()
        if sse:
            chunks = [{"choices": [{"delta": {"reasoning_content": "think "}}]},
                      {"choices": [{"delta": {"content": reply[:3]}}]},
                      {"choices": [{"delta": {"content": reply[3:]}}]}]
            out = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
        else:
            out = json.dumps({"choices": [{"message": {"role": "assistant", "content": reply}}]}).encode()
        return {"type": "http", "request": {"method": b"POST", "path": b"/v1/chat/completions",
                                            "headers": [[b"content-type", b"application/json"]], "content": body},
                "response": {"status_code": 200, "headers": [], "content": out}}

    flows.append(flow([user], "Title"))
    flows.append(flow([sys_msg, user], "<function=ls>", sse=True))
    flows.append(flow([sys_msg, user, {"role": "assistant", "content": "<function=ls>"},
                       {"role": "user", "content": "a.py b.py"}], "done"))
    flows.append({"type": "http", "request": {"method": b"GET", "path": b"/v1/models", "headers": [],
                                              "content": b""}, "response": None})
    path.write_bytes(b"".join(tnet(f) for f in flows))
    return path
