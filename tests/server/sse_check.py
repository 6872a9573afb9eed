"""Validators for each protocol's reply: every piece the README of client-requests lists
as required by some real client."""
from __future__ import annotations

import json


def parse_sse(text: str) -> list[tuple[str | None, object]]:
    """[(event name or None, parsed data)] from raw SSE text; '[DONE]' stays a string."""
    out = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        if data:
            raw = "\n".join(data)
            out.append((name, raw if raw == "[DONE]" else json.loads(raw)))
    return out


def check_anthropic_stream(text: str) -> dict:
    events = parse_sse(text)
    for name, data in events:
        assert name is not None, "every Anthropic SSE data line needs an event: line"
        assert data["type"] == name
    types = [d["type"] for _, d in events]
    assert types[0] == "message_start"
    start = events[0][1]["message"]
    assert isinstance(start["usage"], dict) and isinstance(start["usage"]["input_tokens"], int)
    assert start["role"] == "assistant" and start["content"] == []
    assert types[-1] == "message_stop", types
    assert types[-2] == "message_delta", types
    md = events[-2][1]
    assert md["delta"]["stop_reason"] in ("end_turn", "max_tokens", "tool_use", "stop_sequence",
                                          "model_context_window_exceeded")
    assert isinstance(md["usage"]["output_tokens"], int)
    open_index, blocks = None, []
    for _, d in events[1:-2]:
        if d["type"] == "content_block_start":
            assert open_index is None, "blocks must not overlap"
            open_index = d["index"]
            assert open_index == len(blocks)
            blocks.append(dict(d["content_block"], _json=""))
        elif d["type"] == "content_block_delta":
            assert d["index"] == open_index
            b, delta = blocks[open_index], d["delta"]
            if delta["type"] == "text_delta":
                b["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                b["thinking"] += delta["thinking"]
            elif delta["type"] == "input_json_delta":
                b["_json"] += delta["partial_json"]
            else:
                assert delta["type"] == "signature_delta"
        elif d["type"] == "content_block_stop":
            assert d["index"] == open_index
            open_index = None
        else:
            assert d["type"] == "ping", d
    assert open_index is None, "every content_block_start needs a content_block_stop"
    for b in blocks:
        if b["type"] == "tool_use":
            b["input"] = json.loads(b["_json"])
        b.pop("_json")
    if md["delta"]["stop_reason"] == "tool_use":
        assert any(b["type"] == "tool_use" for b in blocks)
    return {"blocks": blocks, "stop_reason": md["delta"]["stop_reason"]}


def check_anthropic_message(obj: dict) -> dict:
    assert obj["type"] == "message" and obj["role"] == "assistant"
    assert isinstance(obj["content"], list)
    assert obj["stop_reason"] in ("end_turn", "max_tokens", "tool_use", "stop_sequence")
    assert isinstance(obj["usage"]["input_tokens"], int) and isinstance(obj["usage"]["output_tokens"], int)
    return obj


def check_chat_stream(text: str, include_usage: bool) -> dict:
    events = parse_sse(text)
    assert events[-1][1] == "[DONE]"
    chunks = [d for _, d in events[:-1]]
    for c in chunks:
        assert c["object"] == "chat.completion.chunk"
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finals) == 1, "exactly one chunk must carry finish_reason"
    finish = finals[0]["choices"][0]["finish_reason"]
    assert finish in ("stop", "length", "tool_calls")
    usage = [c for c in chunks if c.get("usage")]
    if include_usage:
        assert usage and usage[-1]["choices"] == [] and usage[-1]["usage"]["total_tokens"] > 0
    text, calls = "", {}
    for c in chunks:
        for ch in c["choices"]:
            d = ch["delta"]
            text += d.get("content") or ""
            for tc in d.get("tool_calls") or []:
                call = calls.setdefault(tc["index"], {"id": tc.get("id"), "name": "", "arguments": ""})
                call["name"] += (tc.get("function") or {}).get("name") or ""
                call["arguments"] += (tc.get("function") or {}).get("arguments") or ""
    for call in calls.values():
        assert call["id"] and call["name"]
        json.loads(call["arguments"])
    if finish == "tool_calls":
        assert calls
    return {"text": text, "calls": list(calls.values()), "finish": finish}


def check_chat_completion(obj: dict) -> dict:
    assert obj["object"] == "chat.completion"
    ch = obj["choices"][0]
    assert ch["message"]["role"] == "assistant"
    assert ch["finish_reason"] in ("stop", "length", "tool_calls")
    assert obj["usage"]["total_tokens"] == obj["usage"]["prompt_tokens"] + obj["usage"]["completion_tokens"]
    return obj


def check_responses_stream(text: str) -> dict:
    events = parse_sse(text)
    types = [d["type"] for _, d in events]
    for name, d in events:
        assert name == d["type"]
    assert types[0] == "response.created" and types[1] == "response.in_progress"
    assert types[-1] in ("response.completed", "response.incomplete")
    seq = [d["sequence_number"] for _, d in events]
    assert seq == list(range(len(seq)))
    final = events[-1][1]["response"]
    assert final["usage"]["total_tokens"] > 0
    return final


def check_models(obj: dict) -> None:
    assert obj["object"] == "list" and obj["data"]
    for m in obj["data"]:
        assert m["id"] and m["object"] == "model"
