"""The routing key of an HTTP request: its prompt's token ids, rendered the way the replica
will render them (the adapters' own converters, the chat template, the tokenizer), and the
session it belongs to. A request the front end cannot read gets no key: it is routed by
load, and the replica answers it (with the protocol's 4xx when it is malformed)."""
from __future__ import annotations

import json
import logging

import xxhash

from ..chat import render
from ..prepare import ChatInput
from ..api.anthropic import MessagesRequest, _convert
from ..api.openai import ChatCompletionRequest, openai_messages, openai_tool_choice, openai_tools
from ..api.responses import ResponsesRequest, _chat_input

log = logging.getLogger("freetoken.replicas")

SESSION_HEADERS = ("x-session-id", "x-claude-code-session-id", "session_id")


def _chat(path: str, body: dict) -> ChatInput | str | list[int] | None:
    """The request as the replica's adapter sees it, before `prepare_chat`."""
    if path == "/v1/chat/completions":
        b = ChatCompletionRequest.model_validate(body)
        kwargs = dict(b.chat_template_kwargs or {})
        if b.reasoning_effort in ("none", "minimal"):
            kwargs.setdefault("enable_thinking", False)
        return ChatInput(messages=openai_messages(b.messages), endpoint="chat",
                         tools=openai_tools(b.tools), tool_choice=openai_tool_choice(b.tool_choice),
                         response_format=b.response_format, template_kwargs=kwargs)
    if path == "/v1/messages":
        return _convert(MessagesRequest.model_validate(body), None)
    if path == "/v1/responses":
        return _chat_input(ResponsesRequest.model_validate(body))
    if path == "/v1/completions":
        p = body.get("prompt")
        return p[0] if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str) else p
    return None


def prompt_ids(tokenizer, path: str, raw: bytes) -> list[int] | None:
    """The prompt's token ids, or None when this is no generation request or it does not
    parse (never raises: routing is a hint)."""
    try:
        body = json.loads(raw) if raw else None
        if not isinstance(body, dict):
            return None
        inp = _chat(path, body)
        if isinstance(inp, str):
            return tokenizer.encode(inp)
        if isinstance(inp, list) and all(isinstance(t, int) for t in inp):
            return inp
        if not isinstance(inp, ChatInput):
            return None
        tools = None if inp.tool_choice == "none" else inp.tools
        kwargs = dict(inp.template_kwargs)
        if (inp.response_format or {}).get("type") in ("json_schema", "json_object") or \
                inp.tool_choice not in (None, "auto", "none"):
            kwargs.setdefault("enable_thinking", False)       # as prepare_chat does
        return tokenizer.encode(render(tokenizer, inp.messages, tools, kwargs))
    except Exception as e:  # noqa: BLE001 - a request the replica will reject, or a template error
        log.debug("no routing key for %s: %s", path, e)
        return None


def _opening(body: dict):
    """What opens the conversation: the system prompt and the messages up to the first
    user message (OpenAI and Anthropic `messages`, Responses `instructions` + `input`)."""
    msgs = body.get("messages")
    if msgs is None:
        msgs = body.get("input")
    if isinstance(msgs, str):                 # Responses: a bare string is one user message
        msgs = [{"role": "user", "content": msgs}]
    if not isinstance(msgs, list):
        return None
    for i, m in enumerate(msgs):
        if isinstance(m, dict) and m.get("role") == "user":
            return [body.get("system"), body.get("instructions"), msgs[:i + 1]]
    return None


def session_of(headers: dict[str, str], raw: bytes) -> str | None:
    """The agent session a request belongs to: a session header, OpenAI's
    `prompt_cache_key`, Anthropic's `metadata.user_id` (Claude Code puts its session
    there), OpenAI's `user`; else, for a conversation, a hash of how it opens (system
    prompt and first user message): an agent's history only grows, so every later turn
    of one conversation opens the same way (two that open alike share that prefix too)."""
    for h in SESSION_HEADERS:
        if headers.get(h):
            return headers[h]
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    meta = body.get("metadata")
    for v in (body.get("prompt_cache_key"), meta.get("user_id") if isinstance(meta, dict) else None,
              body.get("user")):
        if isinstance(v, str) and v:
            return v
    opening = _opening(body)
    if opening is None:
        return None
    return "opening:" + xxhash.xxh3_64_hexdigest(json.dumps(opening, sort_keys=True, default=str).encode())
