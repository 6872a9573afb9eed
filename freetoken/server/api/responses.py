"""OpenAI Responses API, stateless: POST /v1/responses (stream and not)."""
from __future__ import annotations

import itertools
import json
import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict

from . import sse
from ..chat import parse_arguments
from ..errors import APIError, BadRequest
from ..events import Done, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart
from .openai import content_text
from ..prepare import ChatInput, prepare_chat
from ..guards.request_limits import client_input
from ..server_state import json_body, parse_body, state, until_disconnected, with_keepalive

router = APIRouter()


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str
    input: str | list[dict]
    instructions: str | None = None
    stream: bool = False
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: dict | None = None
    reasoning: dict | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None


def responses_messages(instructions: str | None, items) -> list[dict]:
    out = [{"role": "system", "content": instructions}] if instructions else []
    if isinstance(items, str):
        return out + [{"role": "user", "content": items}]
    for i, it in enumerate(items):
        where = f"input[{i}]"
        kind = it.get("type", "message")
        if kind == "message":
            role = it.get("role", "user")
            role = "system" if role == "developer" else role
            if role not in ("system", "user", "assistant"):
                raise BadRequest(f"{where}.role: unknown role {role!r}", param=f"{where}.role")
            msg = {"role": role, "content": content_text(it.get("content"), where)}
            if role == "assistant" and out and out[-1]["role"] == "assistant" and \
                    not out[-1]["content"] and out[-1].get("reasoning_content") is not None:
                out[-1]["content"] = msg["content"]
                continue
            out.append(msg)
        elif kind == "function_call":
            call = {"id": it.get("call_id") or it.get("id", ""), "type": "function",
                    "function": {"name": it.get("name", ""),
                                 "arguments": parse_arguments(it.get("arguments"))}}
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = it.get("output")
            out.append({"role": "tool", "tool_call_id": it.get("call_id", ""),
                        "content": output if isinstance(output, str) else content_text(output, where)})
        elif kind == "reasoning":
            text = "".join(c.get("text", "") for c in (it.get("content") or it.get("summary") or [])
                           if isinstance(c, dict))
            out.append({"role": "assistant", "content": "", "reasoning_content": text})
        # item_reference and other stateful items are ignored: this server keeps no state
    if not out:
        raise BadRequest("input: expected at least one item", param="input")
    return out


def responses_tools(tools) -> list[dict] | None:
    out = []
    for i, t in enumerate(tools or []):
        if t.get("type") != "function":
            continue  # built-in tools (web_search, file_search, ...) are not available here
        if not t.get("name"):
            raise BadRequest(f"tools[{i}].name is required", param=f"tools[{i}].name")
        out.append({"type": "function", "function": {
            "name": t["name"], "description": t.get("description") or "",
            "parameters": t.get("parameters") or {"type": "object", "properties": {}}}})
    return out or None


def _format(text: dict | None) -> dict | None:
    fmt = (text or {}).get("format") or {}
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "schema": fmt.get("schema")}
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") not in (None, "text"):       # grammar, regex, ...: refused as chat does
        return {"type": fmt.get("type")}
    return None


class Builder:
    """Accumulates output items; in streaming mode also renders every event."""

    def __init__(self, body: ResponsesRequest, rid: str):
        self.body, self.rid = body, rid
        self.created = int(time.time())
        self.seq = itertools.count()
        self.items: list[dict] = []
        self.open: dict | None = None

    def response(self, status: str, usage=None, incomplete=None) -> dict:
        b = self.body
        return {"id": self.rid, "object": "response", "created_at": self.created, "status": status,
                "model": b.model, "output": self.items if status != "in_progress" else [],
                "usage": usage, "error": None, "incomplete_details": incomplete,
                "instructions": b.instructions, "max_output_tokens": b.max_output_tokens,
                "parallel_tool_calls": b.parallel_tool_calls is not False,
                "previous_response_id": None, "reasoning": b.reasoning,
                "store": False, "temperature": b.temperature, "top_p": b.top_p,
                "tool_choice": b.tool_choice or "auto", "tools": b.tools or [],
                "text": b.text or {"format": {"type": "text"}}, "truncation": "disabled",
                "metadata": {}}

    def ev(self, kind: str, **fields) -> str:
        return sse.event(kind, {"type": kind, "sequence_number": next(self.seq), **fields})

    def _close(self, status: str = "completed") -> list[str]:
        """End the open item; "incomplete" when the output budget cut it off."""
        it, self.open = self.open, None
        if it is None:
            return []
        idx = self.items.index(it)
        out = []
        if it["type"] == "message":
            text = it["content"][0]["text"]
            out.append(self.ev("response.output_text.done", item_id=it["id"], output_index=idx,
                               content_index=0, text=text, logprobs=[]))
            out.append(self.ev("response.content_part.done", item_id=it["id"], output_index=idx,
                               content_index=0, part=it["content"][0]))
        elif it["type"] == "reasoning":
            text = it["content"][0]["text"]
            out.append(self.ev("response.reasoning_text.done", item_id=it["id"], output_index=idx,
                               content_index=0, text=text))
        elif it["type"] == "function_call":
            out.append(self.ev("response.function_call_arguments.done", item_id=it["id"],
                               output_index=idx, arguments=it["arguments"], name=it["name"]))
        it["status"] = status
        out.append(self.ev("response.output_item.done", output_index=idx, item=it))
        return out

    def _add(self, item: dict) -> list[str]:
        out = self._close()
        self.items.append(item)
        self.open = item
        snapshot = json.loads(json.dumps(item))
        if item["type"] == "message":
            snapshot["content"] = []
        out.append(self.ev("response.output_item.added", output_index=len(self.items) - 1,
                           item=snapshot))
        if item["type"] == "message":
            out.append(self.ev("response.content_part.added", item_id=item["id"],
                               output_index=len(self.items) - 1, content_index=0,
                               part={"type": "output_text", "text": "", "annotations": []}))
        return out

    def feed(self, ev) -> list[str]:
        out = []
        idx = len(self.items) - 1
        if isinstance(ev, TextDelta):
            if not self.open or self.open["type"] != "message":
                out += self._add({"id": "msg_" + uuid.uuid4().hex[:24], "type": "message",
                                  "status": "in_progress", "role": "assistant",
                                  "content": [{"type": "output_text", "text": "",
                                               "annotations": [], "logprobs": []}]})
                idx = len(self.items) - 1
            self.open["content"][0]["text"] += ev.text
            out.append(self.ev("response.output_text.delta", item_id=self.open["id"],
                               output_index=idx, content_index=0, delta=ev.text, logprobs=[]))
        elif isinstance(ev, ReasoningDelta):
            if not self.open or self.open["type"] != "reasoning":
                out += self._add({"id": "rs_" + uuid.uuid4().hex[:24], "type": "reasoning",
                                  "status": "in_progress", "summary": [],
                                  "content": [{"type": "reasoning_text", "text": ""}]})
                idx = len(self.items) - 1
            self.open["content"][0]["text"] += ev.text
            out.append(self.ev("response.reasoning_text.delta", item_id=self.open["id"],
                               output_index=idx, content_index=0, delta=ev.text))
        elif isinstance(ev, ToolCallStart):
            out += self._add({"id": "fc_" + ev.id.removeprefix("call_"), "type": "function_call",
                              "status": "in_progress", "call_id": ev.id, "name": ev.name,
                              "arguments": ""})
        elif isinstance(ev, ToolCallDelta):
            self.open["arguments"] += ev.arguments
            out.append(self.ev("response.function_call_arguments.delta", item_id=self.open["id"],
                               output_index=idx, delta=ev.arguments))
        elif isinstance(ev, ToolCallEnd):
            out += self._close()
        return out

    def finish(self, done: Done) -> tuple[list[str], dict]:
        out = self._close("incomplete" if done.finish_reason in ("length", "constraint_failed") else "completed")
        usage = {"input_tokens": done.prompt_tokens, "output_tokens": done.completion_tokens,
                 "total_tokens": done.prompt_tokens + done.completion_tokens,
                 "input_tokens_details": {"cached_tokens": done.cached_tokens},
                 "output_tokens_details": {"reasoning_tokens": 0}}
        if done.finish_reason in ("length", "constraint_failed"):
            why = "max_output_tokens" if done.finish_reason == "length" else "constraint_failed"
            resp = self.response("incomplete", usage, {"reason": why})
            out.append(self.ev("response.incomplete", response=resp))
        else:
            resp = self.response("completed", usage)
            out.append(self.ev("response.completed", response=resp))
        return out, resp


def _chat_input(body: ResponsesRequest) -> ChatInput:
    kwargs = {}
    if (body.reasoning or {}).get("effort") in ("none", "minimal"):
        kwargs["enable_thinking"] = False
    tc = body.tool_choice
    if isinstance(tc, dict):
        tc = {"name": tc.get("name")} if tc.get("type") == "function" else tc.get("type")
        if tc is not None and not isinstance(tc, str) and not isinstance(tc["name"], str):
            raise BadRequest("tool_choice.name: expected the name of a tool", param="tool_choice.name")
    return ChatInput(messages=responses_messages(body.instructions, body.input), endpoint="responses",
                     tools=responses_tools(body.tools), tool_choice=tc,
                     max_tokens=body.max_output_tokens,
                     sampling={"temperature": body.temperature, "top_p": body.top_p},
                     response_format=_format(body.text), template_kwargs=kwargs)


@router.post("/v1/responses", openapi_extra=json_body(ResponsesRequest))
async def responses(request: Request):
    st = state(request)
    body = await parse_body(request, ResponsesRequest)
    st.check_model(body.model, anthropic=False)
    if body.previous_response_id:
        raise BadRequest("previous_response_id is not supported: this server is stateless; send "
                         "the whole conversation in input", param="previous_response_id")
    with client_input("request"):
        inp = _chat_input(body)
    req = await prepare_chat(st.svc, inp)
    gen = st.svc.submit(req)
    b = Builder(body, "resp_" + uuid.uuid4().hex[:24])
    if body.stream:
        return StreamingResponse(_stream(gen, b), media_type="text/event-stream", headers=sse.HEADERS)

    async def run():
        done = None
        async for ev in gen.events():
            b.feed(ev)
            if isinstance(ev, Done):
                done = ev
        if done.finish_reason == "error":
            raise APIError(done.error or "generation failed", status=500)
        return b.finish(done)[1]
    return await until_disconnected(request, gen, run())


async def _stream(gen, b: Builder):
    yield b.ev("response.created", response=b.response("in_progress"))
    yield b.ev("response.in_progress", response=b.response("in_progress"))
    try:
        async for ev in with_keepalive(gen.events()):
            if ev is None:
                yield ": keep-alive\n\n"
            elif isinstance(ev, Done):
                if ev.finish_reason == "error":
                    yield b.ev("error", code="server_error", message=ev.error, param=None)
                    return
                for s in b.finish(ev)[0]:
                    yield s
                if ev.finish_reason == "constraint_failed":
                    yield b.ev("error", code="constraint_failed", message=ev.error, param="text.format")
            else:
                for s in b.feed(ev):
                    yield s
    except APIError as e:
        yield b.ev("error", code=e.code or str(e.status), message=e.message, param=None)
