"""One soak request of each kind, streamed and checked against its protocol: the outcome
(completed, rejected with 429, cancelled by this client, or an error with its class), the
time to the first content event and the gaps between content events."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

TOOLS_OA = [{"type": "function", "function": {"name": "get_weather", "description": "weather in a city",
                                              "parameters": {"type": "object", "properties": {
                                                  "city": {"type": "string"}}, "required": ["city"]}}}]
TOOLS_AN = [{"name": "get_weather", "description": "weather in a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}
PROMPTS = ["Write a haiku about the sea.", "List three prime numbers.", "What is the weather in Paris?",
           "Explain TCP slow start in one paragraph.", "Say hello in five languages."]

# kind -> (weight, description)
KINDS = {"chat": (3, "OpenAI chat, streamed"), "chat_tools": (2, "OpenAI chat with tools, streamed"),
         "responses": (2, "Responses API, streamed"), "messages": (2, "Anthropic messages, streamed"),
         "messages_tools": (2, "Anthropic messages with tools, streamed"),
         "json_schema": (1, "OpenAI chat with a json_schema response_format, not streamed"),
         "chat_agent": (6, "a recorded agent session's next turn (bench/soak_agents.py), streamed")}


@dataclass
class Outcome:
    kind: str
    status: str = "error"          # completed | rejected | cancelled | error
    error: str | None = None
    http_status: int | None = None
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    gap_ends: list[float] = field(default_factory=list)   # time.monotonic() at the end of each gap
    events: int = 0
    retry_after: float | None = None
    detail: str | None = None      # what went wrong, in full (the bad content and its request)


def _body(kind: str, model: str, max_tokens: int, prompt: str) -> tuple[str, dict]:
    msgs = [{"role": "user", "content": prompt}]
    if kind in ("chat", "chat_tools"):
        b = {"model": model, "messages": msgs, "max_tokens": max_tokens, "stream": True,
             "stream_options": {"include_usage": True}}
        if kind == "chat_tools":
            b["tools"] = TOOLS_OA
        return "/v1/chat/completions", b
    if kind == "responses":
        return "/v1/responses", {"model": model, "input": prompt, "max_output_tokens": max_tokens,
                                 "stream": True}
    if kind in ("messages", "messages_tools"):
        b = {"model": "claude-soak", "messages": msgs, "max_tokens": max_tokens, "stream": True}
        if kind == "messages_tools":
            b["tools"] = TOOLS_AN
        return "/v1/messages", b
    return "/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": max_tokens,
                                    "response_format": {"type": "json_schema", "json_schema": {
                                        "name": "r", "schema": SCHEMA}}}


def _content(kind: str, name: str | None, data) -> bool:
    """Whether an SSE event carries generated content (text, reasoning or tool arguments)."""
    if kind.startswith("chat"):
        ch = data.get("choices") or [{}]
        d = ch[0].get("delta") or {}
        return bool(d.get("content") or d.get("reasoning_content") or d.get("tool_calls"))
    if kind.startswith("messages"):
        return name == "content_block_delta"
    return name is not None and name.endswith(".delta")


def _terminal(kind: str, name: str | None, data) -> str | None:
    """'ok' for the protocol's last event, 'error' for an error event, else None."""
    if kind.startswith("chat"):
        if data == "[DONE]":
            return "ok"
        return "error" if isinstance(data, dict) and "error" in data else None
    if kind.startswith("messages"):
        return {"message_stop": "ok", "error": "error"}.get(name)
    return {"response.completed": "ok", "response.incomplete": "ok", "error": "error"}.get(name)


async def one_request(client, url: str, kind: str, model: str, max_tokens: int, drop: bool,
                      drop_after: int, body: dict | None = None) -> Outcome:
    """body: the request to send (an agent turn) instead of the kind's own."""
    import random
    path, own = _body(kind, model, max_tokens, random.choice(PROMPTS))
    body = body or own
    out = Outcome(kind)
    t0 = time.monotonic()
    last = None
    seen = ""                          # the last body or SSE data read, for the report of a failure
    try:
        if kind == "json_schema":
            r = await client.post(url + path, json=body)
            out.http_status = r.status_code
            seen = r.text
            if r.status_code == 429:
                return _rejected(out, r)
            if r.status_code != 200:
                out.error = f"http {r.status_code}"
                return out
            if _bad_json_schema_answer(out, r, body):
                return out
            out.ttft, out.status, out.events = time.monotonic() - t0, "completed", 1
            return out
        async with client.stream("POST", url + path, json=body) as r:
            out.http_status = r.status_code
            if r.status_code == 429:
                await r.aread()
                return _rejected(out, r)
            if r.status_code != 200:
                await r.aread()
                out.error = f"http {r.status_code} {_why(r)}"
                return out
            name, end = None, None
            async for line in r.aiter_lines():
                if line.startswith("event:"):
                    name = line[6:].strip()
                    continue
                if not line.startswith("data:"):
                    continue
                raw = seen = line[5:].strip()
                data = raw if raw == "[DONE]" else json.loads(raw)
                now = time.monotonic()
                if data != "[DONE]" and _content(kind, name, data):
                    out.events += 1
                    if out.ttft is None:
                        out.ttft = now - t0
                    elif last is not None:
                        out.gaps.append(now - last)
                        out.gap_ends.append(now)
                    last = now
                    if drop and out.events >= drop_after:
                        out.status = "cancelled"        # leaving the block closes the connection
                        return out
                end = _terminal(kind, name, data) or end
                if end:
                    break
                name = None
            if end == "ok":
                out.status = "completed"
            else:
                out.error = "error event" if end == "error" else "stream ended without its final event"
            return out
    except Exception as e:  # noqa: BLE001 - every failure is an outcome with its class
        out.error = type(e).__name__
        out.detail = f"{kind}: {type(e).__name__}: {e}; last data read {seen[:2000]!r}"
        print(f"soak: {out.detail}", flush=True)
        return out


def _bad_json_schema_answer(out: Outcome, r, body: dict) -> bool:
    """Whether a 200 json_schema answer broke the grammar's promise (then out says how, in
    full): SCHEMA always has a finite value, so it ends with "stop" and JSON content, or with
    "length"."""
    msg = r.json()["choices"][0]
    reason, content = msg["finish_reason"], msg["message"].get("content")
    if reason not in ("stop", "length"):
        out.error = f"json_schema finish_reason {reason}"
    elif reason == "stop" and _not_json(content):
        out.error = "json_schema content is not JSON"
    else:
        return False
    out.detail = (f"{out.error} ({_not_json(content)}); content {content!r}; response {r.text[:2000]}; "
                  f"request {json.dumps(body)[:2000]}")
    print(f"soak: {out.detail}", flush=True)
    return True


def _not_json(content) -> str | None:
    """Why content is not a JSON text, or None when it is."""
    try:
        json.loads(content)
    except (TypeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def _why(r) -> str:
    """The error's code and param (the class of the refusal, not its text)."""
    try:
        e = r.json().get("error") or {}
        return f"({e.get('code') or e.get('type')}, {e.get('param')})"
    except ValueError:
        return ""


def _rejected(out: Outcome, r) -> Outcome:
    if "retry-after" not in r.headers:
        out.error = "429 without Retry-After"
    else:
        out.status = "rejected"
        out.retry_after = min(float(r.headers["retry-after"]), 10.0)
    return out
