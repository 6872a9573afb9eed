"""Random weights never write a tool call on their own; a request that forces one gets a valid
call anyway (grammar-constrained decoding). Checked with each agent's own read tool, as it
sent it (tests/server/client_shapes), on the real random-weight tiny Qwen3-MoE: the arguments
parse and satisfy the tool's schema. (None of the three agents forces a tool in its own loop:
Claude Code sends no tool_choice, OpenCode and OpenClaw send "auto"; bench/agents_e2e.sh
--free shows what a random model then does in a long session.)"""
from __future__ import annotations

import json

import httpx
import pytest
from test_agent_limits import load

TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list}


def satisfies(args: dict, schema: dict) -> bool:
    """The parts of JSON Schema these read tools use: required, property types, bounds, no extras."""
    props = schema.get("properties", {})
    if any(k not in args for k in schema.get("required", [])):
        return False
    if schema.get("additionalProperties") is False and set(args) - set(props):
        return False
    for k, v in args.items():
        p = props.get(k, {})
        if "type" in p and not isinstance(v, TYPES[p["type"]]) or (p.get("type") == "integer" and isinstance(v, bool)):
            return False
        if "minimum" in p and v < p["minimum"] or "exclusiveMinimum" in p and v <= p["exclusiveMinimum"]:
            return False
        if "maximum" in p and v > p["maximum"]:
            return False
    return True


@pytest.fixture
def uncapped(tiny):
    svc = tiny[2]
    svc.max_tokens_cap = None
    yield tiny
    svc.max_tokens_cap = 8


CASES = [("claude-code/03-messages-after-tool-result.json", "Read"),
         ("opencode/04-chat-after-tool-result.json", "read"),
         ("openclaw/03-chat-after-tool-result.json", "read")]


@pytest.mark.parametrize("name,tool", CASES)
def test_forced_tool_call_from_random_weights_fits_the_agents_schema(uncapped, name, tool):
    pytest.importorskip("llguidance", reason="constrained decoding needs llguidance")
    _, url, _ = uncapped
    fx, _ = load(name)
    body = fx["body"]
    # Sent on the OpenAI route with a seed, so that the sampled tokens (and the test) are
    # repeatable; Claude Code's Read schema goes there too (the Anthropic route has no seed).
    if fx["path"].startswith("/v1/messages"):
        [t] = [t for t in body["tools"] if t["name"] == tool]
        t = {"type": "function", "function": {"name": tool, "parameters": t["input_schema"]}}
    else:
        [t] = [t for t in body["tools"] if t["function"]["name"] == tool]
    schema = t["function"]["parameters"]
    req = {"model": "capture-model", "max_tokens": 1000, "tools": [t], "seed": 1,
           "tool_choice": {"type": "function", "function": {"name": tool}},
           "messages": [{"role": "user", "content": "read the README"}]}
    r = httpx.post(url + "/v1/chat/completions", json=req, timeout=600)
    assert r.status_code == 200, r.text[:300]
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "tool_calls", ch
    fn = ch["message"]["tool_calls"][0]["function"]
    assert fn["name"] == tool
    args = json.loads(fn["arguments"])
    assert satisfies(args, schema), (args, schema)
