"""Qwen3 / Qwen3.5 / Qwen3-Next / Qwen2-MoE: <think> reasoning and <tool_call> blocks,
whose body is either JSON {"name", "arguments"} or the XML function/parameter form:
<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>"""
from __future__ import annotations

import json
import logging
import re

from ..events import Event
from . import forced
from .base import MarkerParser, dropped, strict_loads

log = logging.getLogger("freetoken.server")

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
# chat-format tokens that are never part of an answer (a weak or random model may emit them)
DROP = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_response>", "</tool_response>"]
_FUNC = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|$)", re.S)
# the start of a JSON-form call body: its name, complete, then where the arguments begin
_JSON_HEAD = re.compile(r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*')
_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?(?:</parameter>|(?=<parameter=)|$)", re.S)


class QwenParser(MarkerParser):
    drop = DROP
    call_modes = ("tool",)
    forced_calls = True

    @classmethod
    def forced_call_lark(cls, calls, lit, template: str) -> str:
        """<tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>, or Qwen3-Coder's XML form
        where its template writes that (a bare value as text, others as JSON)."""
        if "<function=" in template:
            bad = ["</parameter>", "<parameter=", "</function>", CALL_CLOSE]

            def call(i, name, schema):
                seq, rules = forced.params(i, schema, lambda k, bare: forced.text(f"<parameter={k}>\n"),
                                           "\n</parameter>\n", lit, bad)
                return " ".join((forced.text(f"<function={name}>\n"), seq, forced.text("</function>"))), rules
        else:
            def call(i, name, schema):
                head = forced.text('{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ')
                return f'{head} a{i} "}}"', [f"a{i}: {forced.json_value(schema)}"]
        return (f'start: {lit(CALL_OPEN)} "\\n" body "\\n" {lit(CALL_CLOSE)}\n'
                + forced.one_of(calls, call))

    def _markers(self) -> list[str]:
        if self.mode == "reasoning":
            return [THINK_CLOSE] + self.drop
        if self.mode == "tool":
            return [CALL_CLOSE]
        return [CALL_OPEN, THINK_OPEN, THINK_CLOSE, CALL_CLOSE] + self.drop   # stray closers are dropped

    def _next(self, m: str) -> str:
        return {THINK_OPEN: "reasoning", THINK_CLOSE: "content", CALL_OPEN: "tool", CALL_CLOSE: "content"}.get(m, self.mode)

    def _call_body(self, body: str) -> list[Event]:
        return self._call(body)

    def _partial_call(self, body: str) -> list[Event]:
        """The call as far as it was written, if its name was: the JSON form's arguments text,
        or the XML form's parameters so far (the last one's value cut)."""
        body = body.strip()
        try:                            # only the closing tag was cut: the call is whole
            return self.tool_call(*self._parse(body))
        except (ValueError, KeyError, TypeError):
            pass
        if body.startswith("<function="):
            f = _FUNC.search(body)
            if f is None or ">" not in body:
                return []
            name = f.group(1).strip()
            args = {k.strip(): self.typed_arg(name, k.strip(), v) for k, v in _PARAM.findall(f.group(2))}
            return self.truncated_call(name, json.dumps(args, ensure_ascii=False))
        m = _JSON_HEAD.match(body)
        if m is None:
            dropped(log, "cut off before the tool name", body)
            return []
        return self.truncated_call(json.loads(m.group(1)), body[m.end():])

    def _call(self, body: str) -> list[Event]:
        body = body.strip()
        try:
            name, args = self._parse(body)
        except (ValueError, KeyError, TypeError) as e:
            dropped(log, str(e), body)
            return []
        return self.tool_call(name, args)

    def _parse(self, body: str) -> tuple[str, dict]:
        if body.startswith("<function="):
            name, args = self._xml(body)
        else:
            obj = strict_loads(body)
            name = obj["name"]
            args = obj.get("arguments", obj.get("parameters", {}))
            if isinstance(args, str):
                args = strict_loads(args)
        if not isinstance(name, str) or not isinstance(args, dict):
            raise ValueError("name must be a string and arguments an object")
        return name, args

    def _xml(self, body: str) -> tuple[str, dict]:
        f = _FUNC.search(body)
        if not f:
            raise ValueError("no <function=...>")
        name = f.group(1).strip()
        return name, {k.strip(): self.typed_arg(name, k.strip(), v) for k, v in _PARAM.findall(f.group(2))}
