"""MiniMax-M2 / M2.1: <think> reasoning (the generation prompt opens it) and tool-call blocks
holding one or more invokes:
<minimax:tool_call>\\n<invoke name="NAME">\\n<parameter name="K">VALUE</parameter>\\n</invoke>\\n</minimax:tool_call>
The template writes a string value as it is and anything else as JSON, so a value is read as
JSON only where the tool's schema says it is not a string (`Parser.typed_arg`, as GLM and
Qwen3-Coder); a string value is kept exactly, newlines included (a file's last newline
survives). Each call is emitted when its </invoke> arrives."""
from __future__ import annotations

import json
import logging
import re

from ..events import Event
from . import forced
from .base import MarkerParser, dropped, held_suffix

log = logging.getLogger("freetoken.server")

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALLS_OPEN, CALLS_CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"
INVOKE_CLOSE = "</invoke>"
# MiniMax's role brackets (end of turn, turn and system headers): never part of an answer
DROP = ["[e~[", "]~b]", "]~!b["]
_INVOKE = re.compile(r'<invoke name="?([^">\n]+)"?>')
# a value ends at its closing tag, or (a model that forgot it) where the next one starts or the text ends
_PARAM = re.compile(r'<parameter name="?([^">\n]+)"?>(.*?)(?:</parameter>|(?=<parameter name=)|\Z)', re.S)


class MiniMaxParser(MarkerParser):
    call_modes = ("calls",)
    forced_calls = True

    @classmethod
    def forced_call_lark(cls, calls, lit, template: str) -> str:
        """The block the template renders, with one invoke:
        \n<minimax:tool_call>\n<invoke name="NAME">\n<parameter name="K">V</parameter>\n</invoke>\n</minimax:tool_call>
        (the generation prompt opens <think>: grammar.py has the output close it first)."""
        bad = ["</parameter>", "<parameter name=", INVOKE_CLOSE, CALLS_CLOSE]

        def call(i, name, schema):
            seq, rules = forced.params(i, schema, lambda k, bare: forced.text(f'<parameter name="{k}">'),
                                       "</parameter>\n", lit, bad)
            return " ".join((forced.text(f'<invoke name="{name}">\n'), seq, forced.text(INVOKE_CLOSE + "\n"))), rules
        return (f'start: "\\n"? {lit(CALLS_OPEN)} "\\n" body {lit(CALLS_CLOSE)}\n'
                + forced.one_of(calls, call))

    def _markers(self) -> list[str]:
        if self.mode == "reasoning":
            return [THINK_CLOSE] + DROP
        if self.mode == "calls":
            return [INVOKE_CLOSE, CALLS_CLOSE]
        return [CALLS_OPEN, THINK_OPEN, THINK_CLOSE, CALLS_CLOSE] + DROP   # stray closers are dropped

    def _next(self, m: str) -> str:
        if m == CALLS_OPEN or (m == INVOKE_CLOSE and self.mode == "calls"):
            return "calls"
        if m == THINK_OPEN:
            return "reasoning"
        if m in (THINK_CLOSE, CALLS_CLOSE):
            return "content"
        return self.mode                                   # a dropped role bracket

    def _parse(self, body: str) -> tuple[str, dict] | None:
        """One invoke's name and typed arguments, or None when no name was written. A body the
        output ended inside may end in half a closing tag: that is not part of the last value."""
        body = body[:len(body) - held_suffix(body, ["</parameter>", INVOKE_CLOSE])]
        f = _INVOKE.search(body)
        if f is None:
            return None
        name = f.group(1).strip()
        args = {}
        for key, value in _PARAM.findall(body[f.end():]):
            args[key.strip()] = self.typed_arg(name, key.strip(), value)
        return name, args

    def _call_body(self, body: str) -> list[Event]:
        parsed = self._parse(body)
        if parsed is None:
            if body.strip():
                dropped(log, "no <invoke name=...>", body)
            return []
        return self.tool_call(*parsed)

    def _partial_call(self, body: str) -> list[Event]:
        """An invoke the token budget cut off: its parameters so far (the last one's value cut),
        if its name was written whole."""
        parsed = self._parse(body)
        if parsed is None:
            return []
        return self.truncated_call(parsed[0], json.dumps(parsed[1], ensure_ascii=False))
