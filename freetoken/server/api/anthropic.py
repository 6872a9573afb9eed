"""Anthropic adapter: /v1/messages (also ?beta=true) and /v1/messages/count_tokens."""
from __future__ import annotations

import asyncio
import base64
import json
import uuid

import pydantic_core
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict

from . import sse
from ..chat import render
from ..errors import APIError, BadRequest, error_body
from ..events import Done, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart
from ..prepare import ChatInput, prepare_chat
from ..guards.request_limits import client_input
from ..server_state import collect, json_body, parse_body, state, until_disconnected, with_keepalive

router = APIRouter()

STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "abort": "end_turn",
        "error": "end_turn"}
SIGNATURE = base64.b64encode(b"freetoken-local-thinking").decode()
BILLING_PREFIX = "x-anthropic-billing-header:"


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str
    messages: list[dict]
    max_tokens: int
    system: str | list[dict] | None = None
    stream: bool = False
    tools: list[dict] | None = None
    tool_choice: dict | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop_sequences: list[str] | None = None
    thinking: dict | None = None
    seed: int | None = None                 # not in Anthropic's API: honoured as on OpenAI routes
    logit_bias: dict | None = None          # refused: this server does not bias logits


class CountTokensRequest(MessagesRequest):
    max_tokens: int | None = None


def blocks_text(content, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where}: expected a string or a list of content blocks")
    parts = []
    for b in content:
        if not isinstance(b, dict):
            raise BadRequest(f"{where}: expected content blocks, got {b!r:.80}")
        t = b.get("type")
        if t == "text":
            text = b.get("text", "")
            if not isinstance(text, str):
                raise BadRequest(f"{where}: a text block's text must be a string", param=where)
            if not text.startswith(BILLING_PREFIX):
                parts.append(text)
        elif t in ("image", "document"):
            parts.append(f"[{t} omitted: this server is text-only]")
        elif t in ("tool_result", "tool_use", "thinking", "redacted_thinking"):
            raise BadRequest(f"{where}: a {t} block is not allowed here")
        # unknown block types (server tool results, citations, ...) are ignored
    return "\n".join(p for p in parts if p)


def anthropic_messages(system, messages: list[dict]) -> list[dict]:
    out = []
    sys_text = blocks_text(system, "system")
    if sys_text:
        out.append({"role": "system", "content": sys_text})
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise BadRequest(f"{where}: expected an object")
        role, content = m.get("role"), m.get("content")
        if role == "system":
            out.append({"role": "system", "content": blocks_text(content, where)})
        elif role == "user":
            out += _user(content, where)
        elif role == "assistant":
            out.append(_assistant(content, where))
        else:
            raise BadRequest(f"{where}.role: expected user or assistant, got {role!r}",
                             param=f"{where}.role")
    if not any(m["role"] != "system" for m in out):
        raise BadRequest("messages: expected at least one message", param="messages")
    return out


def _user(content, where: str) -> list[dict]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content: expected a string or a list of content blocks")
    tools, rest = [], []
    for b in content:
        if isinstance(b, dict) and b.get("type") == "tool_result":
            text = blocks_text(b.get("content"), f"{where}.tool_result")
            if b.get("is_error"):
                text = "Error: " + text
            tools.append({"role": "tool", "tool_call_id": b.get("tool_use_id", ""), "content": text})
        else:
            rest.append(b)
    text = blocks_text(rest, f"{where}.content")
    return tools + ([{"role": "user", "content": text}] if text or not tools else [])


def _assistant(content, where: str) -> dict:
    if isinstance(content, str) or content is None:
        return {"role": "assistant", "content": content or ""}
    text, thinking, calls = [], [], []
    for b in content:
        t = b.get("type") if isinstance(b, dict) else None
        if t == "text":
            text.append(b.get("text", ""))
        elif t == "thinking":
            thinking.append(b.get("thinking", ""))
        elif t == "tool_use":
            calls.append({"id": b.get("id", ""), "type": "function",
                          "function": {"name": b.get("name", ""), "arguments": b.get("input") or {}}})
    msg = {"role": "assistant", "content": "".join(text)}
    if thinking and any(thinking):
        msg["reasoning_content"] = "\n".join(thinking)
    if calls:
        msg["tool_calls"] = calls
    return msg


def anthropic_tools(tools: list[dict] | None) -> list[dict] | None:
    out = []
    for i, t in enumerate(tools or []):
        if not isinstance(t, dict):
            raise BadRequest(f"tools[{i}]: expected an object", param=f"tools[{i}]")
        if t.get("type") not in (None, "custom") and "input_schema" not in t:
            continue  # a server tool (web search, ...) this server cannot run
        if "input_schema" not in t:
            raise BadRequest(f"tools[{i}]: input_schema is required", param=f"tools[{i}].input_schema")
        out.append({"type": "function", "function": {"name": t.get("name"),
                                                     "description": t.get("description", ""),
                                                     "parameters": t["input_schema"]}})
    return out or None


def anthropic_tool_choice(tc: dict | None):
    if not tc:
        return None
    kind = tc.get("type")
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool":
        if not isinstance(tc.get("name"), str):
            raise BadRequest("tool_choice.name: expected the name of a tool", param="tool_choice.name")
        return {"name": tc.get("name")}
    raise BadRequest(f"tool_choice.type: unknown value {kind!r}", param="tool_choice")


def _template_kwargs(body: MessagesRequest) -> dict:
    kind = (body.thinking or {}).get("type")
    if kind is not None and not isinstance(kind, str):
        raise BadRequest("thinking.type: expected enabled, disabled or adaptive", param="thinking.type")
    budget = (body.thinking or {}).get("budget_tokens")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise BadRequest(f"thinking.budget_tokens: expected a positive integer, got {budget!r:.40}",
                         param="thinking.budget_tokens")
    return {"enable_thinking": kind in ("enabled", "adaptive")}


def _chat_input(body: MessagesRequest, max_tokens) -> ChatInput:
    with client_input("request"):
        return _convert(body, max_tokens)


def _convert(body: MessagesRequest, max_tokens) -> ChatInput:
    return ChatInput(messages=anthropic_messages(body.system, body.messages), endpoint="messages",
                     tools=anthropic_tools(body.tools), tool_choice=anthropic_tool_choice(body.tool_choice),
                     max_tokens=max_tokens, stop=body.stop_sequences or [],
                     sampling={"temperature": body.temperature, "top_p": body.top_p,
                               "top_k": body.top_k, "seed": body.seed},
                     template_kwargs=_template_kwargs(body))


def _usage(input_tokens: int, output_tokens: int, cached: int = 0) -> dict:
    """Anthropic counts cache reads apart: input_tokens + cache_read_input_tokens = the prompt."""
    return {"input_tokens": input_tokens - cached, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def _tool_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


@router.post("/v1/messages/count_tokens", openapi_extra=json_body(CountTokensRequest))
async def count_tokens(request: Request):
    st = state(request)
    body = await parse_body(request, CountTokensRequest)
    st.check_model(body.model, anthropic=True)
    inp = _chat_input(body, None)
    prompt = await asyncio.to_thread(render, st.svc.tokenizer, inp.messages, inp.tools,
                                     inp.template_kwargs)
    return {"input_tokens": await asyncio.to_thread(st.svc.count_prompt, prompt)}


@router.post("/v1/messages", openapi_extra=json_body(MessagesRequest))
async def messages(request: Request):
    st = state(request)
    body = await parse_body(request, MessagesRequest)
    st.check_model(body.model, anthropic=True)
    req = await prepare_chat(st.svc, _chat_input(body, body.max_tokens))
    if (body.tool_choice or {}).get("disable_parallel_tool_use"):
        req.max_tool_calls = 1
    gen = st.svc.submit(req)
    mid = "msg_" + uuid.uuid4().hex[:24]
    omit_thinking = (body.thinking or {}).get("display") == "omitted"
    if body.stream:
        return StreamingResponse(_stream(gen, mid, body.model, len(req.prompt_ids), omit_thinking),
                                 media_type="text/event-stream", headers=sse.HEADERS)
    text, reasoning, calls, done = await until_disconnected(request, gen, collect(gen))
    if done.finish_reason == "constraint_failed":      # Anthropic has no stop_reason for it
        raise BadRequest(done.error)
    content = []
    if reasoning:
        content.append({"type": "thinking", "thinking": "" if omit_thinking else reasoning,
                        "signature": SIGNATURE})
    if text:
        content.append({"type": "text", "text": text})
    for start, args in calls:
        content.append({"type": "tool_use", "id": _tool_id(start.id), "name": start.name,
                        "input": _tool_input(args)})
    return {"id": mid, "type": "message", "role": "assistant", "model": body.model,
            "content": content, "stop_reason": _stop_reason(done),
            "stop_sequence": done.stop_sequence,
            "usage": _usage(done.prompt_tokens, done.completion_tokens, done.cached_tokens)}


def _tool_input(args: str) -> dict:
    """A call's arguments as the object `input` must be; a call max_tokens cut off (stop_reason
    max_tokens) keeps what was complete of it, as the SDKs' own partial-JSON readers do."""
    try:
        return json.loads(args)
    except ValueError:
        try:
            obj = pydantic_core.from_json(args, allow_partial=True)
        except ValueError:
            return {}
        return obj if isinstance(obj, dict) else {}


def _stop_reason(done: Done) -> str:
    if done.stop_sequence:
        return "stop_sequence"
    if done.context_full:            # Anthropic's own reason: the window, not max_tokens, ended it
        return "model_context_window_exceeded"
    return STOP[done.finish_reason]


async def _stream(gen, mid: str, model: str, n_prompt: int, omit_thinking: bool):
    started = False

    def message_start() -> str:
        """Sent with the first event (or the first keep-alive of a long prefill), once the
        prefix cache's share of the prompt is known: it goes into cache_read_input_tokens."""
        nonlocal started
        started = True
        return sse.event("message_start", {"type": "message_start", "message": {
            "id": mid, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": _usage(n_prompt, 1, gen.cached_tokens)}}) + sse.event("ping", {"type": "ping"})
    index, kind = -1, None

    def stop_block():
        out = ""
        if kind == "thinking":
            out += sse.event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                     "delta": {"type": "signature_delta",
                                                               "signature": SIGNATURE}})
        if kind is not None:
            out += sse.event("content_block_stop", {"type": "content_block_stop", "index": index})
        return out

    def start_block(new_kind: str, block: dict):
        nonlocal index, kind
        out = stop_block()
        index, kind = index + 1, new_kind
        return out + sse.event("content_block_start", {"type": "content_block_start",
                                                       "index": index, "content_block": block})

    def delta(d: dict):
        return sse.event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                 "delta": d})

    done = None
    try:
        async for ev in with_keepalive(gen.events()):
            if not started:
                yield message_start()
                if ev is None:
                    continue
            if ev is None:
                yield sse.event("ping", {"type": "ping"})
            elif isinstance(ev, ReasoningDelta):
                if kind != "thinking":
                    yield start_block("thinking", {"type": "thinking", "thinking": "",
                                                   "signature": ""})
                if not omit_thinking:
                    yield delta({"type": "thinking_delta", "thinking": ev.text})
            elif isinstance(ev, TextDelta):
                if kind != "text":
                    yield start_block("text", {"type": "text", "text": ""})
                yield delta({"type": "text_delta", "text": ev.text})
            elif isinstance(ev, ToolCallStart):
                yield start_block("tool_use", {"type": "tool_use", "id": _tool_id(ev.id),
                                               "name": ev.name, "input": {}})
            elif isinstance(ev, ToolCallDelta):
                yield delta({"type": "input_json_delta", "partial_json": ev.arguments})
            elif isinstance(ev, ToolCallEnd):
                yield stop_block()
                kind = None
            elif isinstance(ev, Done):
                done = ev
    except APIError as e:
        yield sse.event("error", error_body(e, anthropic=True))
        return
    if not started:
        yield message_start()
    if kind is not None:
        yield stop_block()
    if done.error:
        yield sse.event("error", {"type": "error", "error": {"type": "api_error",
                                                             "message": done.error}})
        return
    yield sse.event("message_delta", {"type": "message_delta",
                                      "delta": {"stop_reason": _stop_reason(done),
                                                "stop_sequence": done.stop_sequence},
                                      "usage": _usage(done.prompt_tokens, done.completion_tokens, done.cached_tokens)})
    yield sse.event("message_stop", {"type": "message_stop"})
