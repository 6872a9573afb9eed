"""Chat prompts: render a neutral conversation with the checkpoint's chat template.

Neutral messages are the Hugging Face template dicts: role system|user|assistant|tool,
string `content`, assistant `tool_calls` [{id, type, function: {name, arguments: dict}}]
and `reasoning_content`, tool `tool_call_id`. Tools are OpenAI function tools.
"""
from __future__ import annotations

import json
import logging
import re

from .errors import BadRequest

log = logging.getLogger("freetoken.server")

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")


def check_tools(tools: list[dict]) -> None:
    """Reject tool definitions a template or a client could not use."""
    for i, t in enumerate(tools):
        f = t.get("function") if isinstance(t, dict) else None
        if not isinstance(f, dict):
            raise BadRequest(f"tools[{i}]: expected a function tool", param=f"tools[{i}]")
        name = f.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            raise BadRequest(f"tools[{i}].name: expected 1-128 characters of [A-Za-z0-9_.:-], "
                             f"got {name!r}", param=f"tools[{i}].name")
        params = f.get("parameters")
        if params is None:
            continue
        if not isinstance(params, dict):
            raise BadRequest(f"tools[{i}] ({name}): the parameters schema must be a JSON object",
                             param=f"tools[{i}].parameters")
        typ = params.get("type", "object")
        if typ != "object" and not (isinstance(typ, list) and "object" in typ):
            raise BadRequest(f"tools[{i}] ({name}): the parameters schema must have type "
                             f"'object', got {typ!r}", param=f"tools[{i}].parameters")
        props = params.get("properties", {})
        if not isinstance(props, dict) or not all(isinstance(v, (dict, bool)) for v in props.values()):
            raise BadRequest(f"tools[{i}] ({name}): 'properties' must map names to schemas",
                             param=f"tools[{i}].parameters")
        req = params.get("required", [])
        if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
            raise BadRequest(f"tools[{i}] ({name}): 'required' must be a list of names",
                             param=f"tools[{i}].parameters")


def parse_arguments(args) -> dict | str:
    """Tool-call arguments as a dict for the template (it may re-serialize them)."""
    if isinstance(args, dict):
        return args
    if isinstance(args, str):
        try:
            v = json.loads(args) if args.strip() else {}
            return v if isinstance(v, dict) else args
        except ValueError:
            return args
    return {}


def _merge_systems(messages: list[dict]) -> list[dict]:
    """Fold every system message into one leading system message, for templates that only
    accept a system message first (Claude Code sends one after the user turn)."""
    systems = [m["content"] for m in messages if m["role"] == "system" and m.get("content")]
    rest = [m for m in messages if m["role"] != "system"]
    return ([{"role": "system", "content": "\n\n".join(systems)}] if systems else []) + rest


def render(tokenizer, messages: list[dict], tools: list[dict] | None,
           template_kwargs: dict | None = None) -> str:
    kw = dict(template_kwargs or {})
    try:
        return tokenizer.apply_chat_template(messages, tools=tools or None,
                                             add_generation_prompt=True, **kw)
    except Exception as first:  # noqa: BLE001 - templates raise anything
        merged = _merge_systems(messages)
        if merged != messages:
            try:
                return tokenizer.apply_chat_template(merged, tools=tools or None,
                                                     add_generation_prompt=True, **kw)
            except Exception:  # noqa: BLE001
                pass
        raise BadRequest(f"the chat template could not render this conversation: {first}")


def starts_in_reasoning(prompt: str) -> bool:
    """The template opened a reasoning block for the model (e.g. Qwen3.5 thinking)."""
    tail = prompt.rstrip()
    return tail.endswith("<think>")
