"""`POST /tokenize` and `POST /detokenize` in both shapes tools send:
- llama-server: `{"content": TEXT, "add_special"?, "with_pieces"?}` -> `{"tokens": [...]}`
  (with_pieces: `[{"id", "piece"}]`); `{"tokens": [...]}` -> `{"content": TEXT}`;
- vLLM: `{"model", "prompt": TEXT, "add_special_tokens"?}` or `{"model", "messages", "tools"?,
  "add_generation_prompt"?, "chat_template_kwargs"?}` (rendered with the chat template, as a
  chat request would be) -> `{"tokens", "count", "max_model_len", "token_strs"}`;
  `{"model", "tokens"}` -> `{"prompt": TEXT}`.
A body with a `model` gets the vLLM shape; one without, the llama-server shape."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from ..chat import check_tools, render
from ..errors import BadRequest
from .openai import openai_messages, openai_tools
from ..guards.request_limits import client_input, parse_json, read_body
from ..server_state import state

router = APIRouter()


async def _body(request: Request) -> dict:
    st = state(request)
    body = await asyncio.to_thread(parse_json, await read_body(request, st.settings.max_body_bytes))
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    if "model" in body:
        if not isinstance(body["model"], str):
            raise BadRequest("model: expected a string", param="model")
        st.check_model(body["model"], anthropic=False)
    return body


def _flag(body: dict, name: str, default: bool) -> bool:
    v = body.get(name, default)
    if not isinstance(v, bool):
        raise BadRequest(f"{name}: expected true or false, got {v!r:.40}", param=name)
    return v


def _text(body: dict, name: str) -> str:
    v = body[name]
    if not isinstance(v, str):
        raise BadRequest(f"{name}: expected a string, got {type(v).__name__}", param=name)
    return v


def _encode(tok, text: str, add_special: bool) -> list[int]:
    try:
        return tok.encode(text, add_special_tokens=add_special)
    except TypeError:                 # a tokenizer without the option (it adds none)
        return tok.encode(text)


def _piece(tok, i: int) -> str:
    return tok.decode([i], skip_special_tokens=False)


@router.post("/tokenize")
async def tokenize(request: Request):
    body = await _body(request)
    svc = state(request).svc
    tok = svc.tokenizer
    if "content" in body:                                   # llama-server
        text = _text(body, "content")
        ids = await asyncio.to_thread(_encode, tok, text, _flag(body, "add_special", False))
        if _flag(body, "with_pieces", False):
            return {"tokens": [{"id": i, "piece": _piece(tok, i)} for i in ids]}
        return {"tokens": ids}
    if "prompt" in body:                                    # vLLM, completions shape
        text = _text(body, "prompt")
        ids = await asyncio.to_thread(_encode, tok, text, _flag(body, "add_special_tokens", True))
    elif "messages" in body:                                # vLLM, chat shape
        if not isinstance(body["messages"], list):
            raise BadRequest("messages: expected a list of messages", param="messages")
        kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise BadRequest("chat_template_kwargs: expected an object", param="chat_template_kwargs")
        with client_input("request"):
            messages = openai_messages(body["messages"])
            tools = openai_tools(body.get("tools"))
        if tools:
            check_tools(tools)
        add_gen = _flag(body, "add_generation_prompt", True)
        if add_gen:
            prompt = await asyncio.to_thread(render, tok, messages, tools, kwargs)
        else:   # render() always adds the generation prompt; the template call without it
            prompt = await asyncio.to_thread(_render_plain, tok, messages, tools, kwargs)
        ids = await asyncio.to_thread(_encode, tok, prompt, _flag(body, "add_special_tokens", False))
    else:
        raise BadRequest("expected 'content' (llama-server), 'prompt' or 'messages' (vLLM)",
                         param="content")
    return {"count": len(ids), "max_model_len": svc.max_model_len, "tokens": ids, "token_strs": None}


def _render_plain(tok, messages, tools, kwargs) -> str:
    try:
        return tok.apply_chat_template(messages, tools=tools or None, add_generation_prompt=False,
                                       **kwargs)
    except Exception as e:  # noqa: BLE001 - templates raise anything
        raise BadRequest(f"the chat template could not render this conversation: {e}") from None


@router.post("/detokenize")
async def detokenize(request: Request):
    body = await _body(request)
    tok = state(request).svc.tokenizer
    ids = body.get("tokens")
    if not isinstance(ids, list):
        raise BadRequest("tokens: expected a list of token ids", param="tokens")
    vocab = getattr(tok, "vocab_size", None) or 1 << 62
    for i, t in enumerate(ids):
        if isinstance(t, dict):          # llama-server's with_pieces form
            t = t.get("id")
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
            raise BadRequest(f"tokens[{i}]: expected a token id in [0, {vocab}), got {t!r:.40}",
                             param=f"tokens[{i}]")
        ids[i] = t
    text = await asyncio.to_thread(tok.decode, ids, skip_special_tokens=False)
    return {"prompt": text} if "model" in body else {"content": text}
