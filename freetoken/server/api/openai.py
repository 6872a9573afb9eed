"""OpenAI adapter: /v1/chat/completions, /v1/completions, /v1/models."""
from __future__ import annotations

import asyncio
import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, StrictBool

from . import sse
from ...engine.logprobs import prompt_logprobs
from .logprobs import TokenStrings, chat_logprobs, check_echo_size, check_top, completion_logprobs
from ..chat import parse_arguments
from ..errors import APIError, BadRequest, error_body
from ..events import Done, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallStart
from ..prepare import ChatInput, prepare_chat, prepare_text
from ..guards.request_limits import client_input
from ..server_state import collect, json_body, parse_body, state, until_disconnected, with_keepalive

router = APIRouter()

FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls", "abort": "stop",
          "error": "stop", "constraint_failed": "constraint_failed"}


def constraint_error(done: Done) -> str:
    """The stream event after the finish chunk of an output its grammar cut short."""
    return sse.data({"error": {"message": done.error, "type": "constraint_failed", "param": "response_format",
                               "code": "constraint_failed"}})


class _SamplingFields(BaseModel):
    """Fields shared by chat and text completions; unknown fields are accepted and ignored."""
    model_config = ConfigDict(extra="allow")
    model: str
    stream: bool = False
    stream_options: dict | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    n: int | None = None
    logit_bias: dict | None = None     # refused when not empty (server_state.validate_body)
    ignore_eos: StrictBool | None = None   # vLLM/SGLang: generate past EOS up to max_tokens


class ChatCompletionRequest(_SamplingFields):
    messages: list[dict]
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    max_completion_tokens: int | None = None
    response_format: dict | None = None
    reasoning_effort: str | None = None
    chat_template_kwargs: dict | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None        # top-k alternatives per token (0..MAX_TOP_LOGPROBS)
    echo: bool | None = None           # the prompt first in the text (and its tokens' logprobs)


def content_text(content, where: str) -> str:
    """OpenAI message content (string or parts) as plain text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content: expected a string or a list of parts")
    out = []
    for p in content:
        if isinstance(p, str):
            out.append(p)
        elif isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text"):
            out.append(str(p.get("text", "")))
        elif isinstance(p, dict) and p.get("type") in ("image_url", "input_image", "image"):
            out.append("[image omitted: this server is text-only]")
        elif isinstance(p, dict) and p.get("type") == "refusal":
            out.append(str(p.get("refusal", "")))
        else:
            raise BadRequest(f"{where}.content: unsupported part {p!r:.100}")
    return "".join(out)


def openai_messages(messages: list[dict]) -> list[dict]:
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or "role" not in m:
            raise BadRequest(f"{where}: expected an object with a role", param=where)
        role = m["role"]
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant", "tool", "function"):
            raise BadRequest(f"{where}.role: unknown role {role!r}", param=f"{where}.role")
        msg = {"role": "tool" if role == "function" else role,
               "content": content_text(m.get("content"), where)}
        if role == "assistant":
            calls = []
            for j, c in enumerate(m.get("tool_calls") or []):
                f = c.get("function") or {}
                # a missing id gets one from its place, not a random one: the same history
                # must render to the same tokens every time (prefix cache)
                calls.append({"id": c.get("id") or f"call_{i}_{j}",
                              "type": "function",
                              "function": {"name": f.get("name", ""),
                                           "arguments": parse_arguments(f.get("arguments"))}})
            if calls:
                msg["tool_calls"] = calls
            reasoning = m.get("reasoning_content") or m.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                msg["reasoning_content"] = reasoning
        if msg["role"] == "tool":
            msg["tool_call_id"] = m.get("tool_call_id") or ""
            if m.get("name"):
                msg["name"] = m["name"]
        out.append(msg)
    if not out:
        raise BadRequest("messages: expected at least one message", param="messages")
    return out


def openai_tools(tools: list[dict] | None) -> list[dict] | None:
    if not tools:
        return None
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type", "function") != "function" or \
                not isinstance(t.get("function"), dict):
            raise BadRequest(f"tools[{i}]: expected {{'type': 'function', 'function': {{...}}}}",
                             param=f"tools[{i}]")
        out.append({"type": "function", "function": t["function"]})
    return out


def openai_tool_choice(tc) -> str | dict | None:
    if isinstance(tc, dict):
        fn = tc.get("function")
        name = (fn.get("name") if isinstance(fn, dict) else None) or tc.get("name")
        if not isinstance(name, str):
            raise BadRequest("tool_choice: expected {'type': 'function', 'function': {'name': NAME}}",
                             param="tool_choice")
        return {"name": name}
    return tc


def response_format(rf: dict | None) -> dict | None:
    if not rf:
        return None
    if rf.get("type") == "json_schema":
        js = rf.get("json_schema") or {}
        if not isinstance(js, dict):
            raise BadRequest("response_format.json_schema: expected an object with a 'schema'",
                             param="response_format.json_schema")
        schema = js.get("schema", rf.get("schema"))
        if schema is not None and not isinstance(schema, dict):
            raise BadRequest("response_format.json_schema.schema must be an object",
                             param="response_format")
        return {"type": "json_schema", "schema": schema}
    if not isinstance(rf.get("type"), str):
        raise BadRequest("response_format.type: expected text, json_object or json_schema",
                         param="response_format.type")
    return {"type": rf.get("type")}


def _sampling(body) -> dict:
    return {k: getattr(body, k) for k in ("temperature", "top_p", "top_k", "min_p", "seed",
                                          "presence_penalty", "frequency_penalty",
                                          "repetition_penalty", "ignore_eos")}


def _usage(d: Done) -> dict:
    return {"prompt_tokens": d.prompt_tokens, "completion_tokens": d.completion_tokens,
            "total_tokens": d.prompt_tokens + d.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": d.cached_tokens}}


def limits(svc) -> dict:
    """What `freetoken launch` (and any client that reads them) configures agents with: the
    context window, the largest prompt, and the largest reply this server gives."""
    return {"max_model_len": svc.max_model_len, "max_input_tokens": svc.max_model_len - 1,
            "max_output_tokens": svc.max_output_tokens}


@router.get("/v1/models")
async def list_models(request: Request):
    st = state(request)
    created = int(st.started)
    data = [{"id": n, "object": "model", "created": created, "owned_by": "freetoken",
             "type": "model", "display_name": n, "created_at": st.started_iso,
             **limits(st.svc)} for n in st.settings.model_names]
    return {"object": "list", "data": data, "has_more": False,
            "first_id": data[0]["id"], "last_id": data[-1]["id"]}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request):
    st = state(request)
    st.check_model(model_id, anthropic=False)
    return {"id": model_id, "object": "model", "created": int(st.started), "owned_by": "freetoken",
            "type": "model", "display_name": model_id, "created_at": st.started_iso,
            **limits(st.svc)}


async def _parse(request: Request, model: type[_SamplingFields]):
    """Validate the body, check the model id, reject n > 1: what every completion route does first."""
    st = state(request)
    body = await parse_body(request, model)
    st.check_model(body.model, anthropic=False)
    if body.n not in (None, 1):
        raise BadRequest("n > 1 is not supported", param="n")
    return st, body


@router.post("/v1/chat/completions", openapi_extra=json_body(ChatCompletionRequest))
async def chat_completions(request: Request):
    st, body = await _parse(request, ChatCompletionRequest)
    top_k = None
    if body.logprobs:
        top_k = check_top(body.top_logprobs or 0, "top_logprobs")
    elif body.top_logprobs:
        raise BadRequest("top_logprobs needs logprobs: true", param="top_logprobs")
    strings = await asyncio.to_thread(TokenStrings, st.svc) if top_k is not None else None
    kwargs = dict(body.chat_template_kwargs or {})
    if body.reasoning_effort in ("none", "minimal"):
        kwargs.setdefault("enable_thinking", False)
    with client_input("request"):
        inp = ChatInput(messages=openai_messages(body.messages), endpoint="chat",
                        tools=openai_tools(body.tools), tool_choice=openai_tool_choice(body.tool_choice),
                        max_tokens=body.max_completion_tokens if body.max_completion_tokens is not None
                        else body.max_tokens, stop=body.stop, sampling={**_sampling(body), "logprobs": top_k},
                        response_format=response_format(body.response_format), template_kwargs=kwargs)
    req = await prepare_chat(st.svc, inp)
    if body.parallel_tool_calls is False:
        req.max_tool_calls = 1
    gen = st.svc.submit(req)
    cid = "chatcmpl-" + uuid.uuid4().hex[:24]
    created = int(time.time())
    model = body.model
    if body.stream:
        usage = bool((body.stream_options or {}).get("include_usage"))
        return StreamingResponse(_chat_stream(gen, cid, created, model, usage, strings, top_k),
                                 media_type="text/event-stream", headers=sse.HEADERS)
    events = await until_disconnected(request, gen, collect(gen))
    text, reasoning, calls, done = events
    msg = {"role": "assistant", "content": text if text or not calls else None}
    if reasoning:
        msg["reasoning_content"] = reasoning
    if calls:
        msg["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": args}} for c, args in calls]
    return {"id": cid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": msg,
                         "logprobs": chat_logprobs(strings, gen.logprobs, top_k) if strings else None,
                         "finish_reason": FINISH[done.finish_reason]}],
            "usage": _usage(done), "system_fingerprint": "freetoken"}


async def _chat_stream(gen, cid, created, model, include_usage, strings=None, top_k=None):
    base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "system_fingerprint": "freetoken"}
    sent = 0

    def chunk(delta, finish=None):
        nonlocal sent
        lp = None
        if strings is not None and len(gen.logprobs) > sent:   # the tokens since the last chunk
            lp = chat_logprobs(strings, gen.logprobs[sent:], top_k)
            sent = len(gen.logprobs)
        return sse.data({**base, "choices": [{"index": 0, "delta": delta, "logprobs": lp,
                                              "finish_reason": finish}]})

    yield chunk({"role": "assistant", "content": ""})
    done = None
    try:
        async for ev in with_keepalive(gen.events()):
            if ev is None:
                yield ": keep-alive\n\n"
            elif isinstance(ev, TextDelta):
                yield chunk({"content": ev.text})
            elif isinstance(ev, ReasoningDelta):
                yield chunk({"reasoning_content": ev.text})
            elif isinstance(ev, ToolCallStart):
                yield chunk({"tool_calls": [{"index": ev.index, "id": ev.id, "type": "function",
                                             "function": {"name": ev.name, "arguments": ""}}]})
            elif isinstance(ev, ToolCallDelta):
                yield chunk({"tool_calls": [{"index": ev.index,
                                             "function": {"arguments": ev.arguments}}]})
            elif isinstance(ev, Done):
                done = ev
    except APIError as e:
        yield sse.data(error_body(e, anthropic=False))
        yield sse.DONE
        return
    if done.finish_reason == "error":     # the error is the last event: no finish_reason after it
        yield sse.data({"error": {"message": done.error, "type": "server_error", "param": None,
                                  "code": None}})
        yield sse.DONE
        return
    yield chunk({}, FINISH[done.finish_reason])
    if done.finish_reason == "constraint_failed":
        yield constraint_error(done)
    if include_usage:
        yield sse.data({**base, "choices": [], "usage": _usage(done)})
    yield sse.DONE


def _one_prompt(prompt):
    """The request's single prompt: a string or token ids; a batch of one (["..."] or
    [[ids]], as lm-evaluation-harness sends) is that one."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise BadRequest("a batch of prompts is not supported; send one", param="prompt")
        prompt = prompt[0]
    return prompt


@router.post("/v1/completions", openapi_extra=json_body(CompletionRequest))
async def completions(request: Request):
    st, body = await _parse(request, CompletionRequest)
    prompt = _one_prompt(body.prompt)
    top_k = None if body.logprobs is None else check_top(body.logprobs, "logprobs")
    echo = bool(body.echo)
    max_tokens, prompt_only = body.max_tokens, False
    if echo and max_tokens == 0:        # the prompt's logprobs alone: one token made, not returned
        max_tokens, prompt_only = 1, True
    if body.stream and echo and top_k is not None:
        raise BadRequest("echo with logprobs is answered whole: send stream: false", param="echo")
    req = await prepare_text(st.svc, prompt, endpoint="completions", max_tokens=max_tokens,
                             stop=body.stop, sampling={**_sampling(body), "logprobs": top_k})
    req.want_prompt_logits = echo and top_k is not None
    if req.want_prompt_logits:
        check_echo_size(len(req.prompt_ids), st.svc.engine.vocab_size)
    strings = await asyncio.to_thread(TokenStrings, st.svc) if top_k is not None else None
    prompt_text = ""
    if echo or strings is not None:
        prompt_text = prompt if isinstance(prompt, str) else \
            await asyncio.to_thread(st.svc.tokenizer.decode, req.prompt_ids)
    gen = st.svc.submit(req)
    cid = "cmpl-" + uuid.uuid4().hex[:24]
    created = int(time.time())
    base = {"id": cid, "object": "text_completion", "created": created, "model": body.model}
    if body.stream:
        include_usage = bool((body.stream_options or {}).get("include_usage"))

        async def stream():
            done = None
            sent, at = 0, len(prompt_text)

            def lp():
                nonlocal sent, at
                if strings is None or len(gen.logprobs) <= sent:
                    return None
                new = list(zip(gen.token_ids[sent:len(gen.logprobs)], gen.logprobs[sent:]))
                sent = len(gen.logprobs)
                obj, at = completion_logprobs(strings, new, at)
                return obj
            try:
                if echo:
                    yield sse.data({**base, "choices": [{"index": 0, "text": prompt_text,
                                                         "logprobs": None, "finish_reason": None}]})
                async for ev in gen.events():
                    if isinstance(ev, TextDelta):
                        yield sse.data({**base, "choices": [{"index": 0, "text": ev.text,
                                                             "logprobs": lp(), "finish_reason": None}]})
                    elif isinstance(ev, Done):
                        done = ev
            except APIError as e:
                yield sse.data(error_body(e, anthropic=False))
                yield sse.DONE
                return
            if done.finish_reason == "error":
                yield sse.data({"error": {"message": done.error, "type": "server_error",
                                          "param": None, "code": None}})
                yield sse.DONE
                return
            yield sse.data({**base, "choices": [{"index": 0, "text": "", "logprobs": lp(),
                                                 "finish_reason": FINISH[done.finish_reason]}]})
            if done.finish_reason == "constraint_failed":
                yield constraint_error(done)
            if include_usage:
                yield sse.data({**base, "choices": [], "usage": _usage(done)})
            yield sse.DONE
        return StreamingResponse(stream(), media_type="text/event-stream", headers=sse.HEADERS)
    text, _, _, done = await until_disconnected(request, gen, collect(gen))
    logprobs = None
    if strings is not None:                 # (an "error" finish raised in collect)
        logprobs = await asyncio.to_thread(_completion_logprobs, strings, req, gen, echo, prompt_only,
                                           top_k, len(prompt_text))
    usage = _usage(done)
    if prompt_only:
        text = ""
        usage.update(completion_tokens=0, total_tokens=usage["prompt_tokens"])
    return {**base, "choices": [{"index": 0, "text": (prompt_text if echo else "") + text,
                                 "logprobs": logprobs, "finish_reason": FINISH[done.finish_reason]}],
            "usage": usage}


def _completion_logprobs(strings, req, gen, echo: bool, prompt_only: bool, top_k: int,
                         prompt_chars: int) -> dict:
    entries = []
    if echo:
        if gen.prompt_logits is None:
            raise APIError("the engine returned no prompt logits for echo", status=500)
        entries += list(zip(req.prompt_ids, prompt_logprobs(gen.prompt_logits, req.prompt_ids, top_k)))
    if not prompt_only:      # every generated token, a stop token included (its text is not)
        entries += list(zip(gen.token_ids, gen.logprobs))
    return completion_logprobs(strings, entries, 0 if echo else prompt_chars)[0]
