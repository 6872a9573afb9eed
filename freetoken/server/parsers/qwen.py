"""Qwen3 / Qwen3.5 / Qwen3-Next / Qwen2-MoE: <think> reasoning and <tool_call> blocks,
whose body is either JSON {"name", "arguments"} or the XML function/parameter form:
<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>"""
from __future__ import annotations

import json
import logging
import re

from ..events import Event, ReasoningDelta, TextDelta
from .base import Parser, WhitespaceHold, find_first, held_suffix

log = logging.getLogger("freetoken.server")

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
# chat-format tokens that are never part of an answer (a weak or random model may emit them)
DROP = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_response>", "</tool_response>"]
_FUNC = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|$)", re.S)
_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?(?:</parameter>|(?=<parameter=)|$)", re.S)


class QwenParser(Parser):
    drop = DROP

    def __init__(self, tools: list[dict] | None = None, reasoning: bool = False):
        super().__init__(tools)
        self.mode = "reasoning" if reasoning else "content"
        self.buf = ""
        self.text = WhitespaceHold(TextDelta)
        self.thought = WhitespaceHold(ReasoningDelta)

    def _markers(self) -> list[str]:
        if self.mode == "reasoning":
            return [THINK_CLOSE] + self.drop
        if self.mode == "tool":
            return [CALL_CLOSE]
        return [CALL_OPEN, THINK_OPEN, THINK_CLOSE, CALL_CLOSE] + self.drop   # stray closers are dropped

    def _emit(self, s: str, out: list[Event]) -> None:
        if self.mode == "reasoning":
            self.thought.push(s, out)
        elif self.mode == "content":
            self.text.push(s, out)

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        self.buf += text
        while True:
            markers = self._markers()
            i, m = find_first(self.buf, markers)
            if m is None:
                if self.mode != "tool":
                    keep = held_suffix(self.buf, markers)
                    self._emit(self.buf[:len(self.buf) - keep], out)
                    self.buf = self.buf[len(self.buf) - keep:]
                return out
            if self.mode == "tool":
                out += self._call(self.buf[:i])
                self.text.ws = ""
            else:
                self._emit(self.buf[:i], out)
            self.buf = self.buf[i + len(m):]
            self.mode = {THINK_OPEN: "reasoning", THINK_CLOSE: "content", CALL_OPEN: "tool",
                         CALL_CLOSE: "content"}.get(m, self.mode)

    def finish(self) -> list[Event]:
        out: list[Event] = []
        if self.mode == "tool":
            out += self._call(self.buf)
        else:
            self._emit(self.buf, out)
        self.buf = ""
        return out

    def _call(self, body: str) -> list[Event]:
        body = body.strip()
        try:
            if body.startswith("<function="):
                name, args = self._xml(body)
            else:
                obj = json.loads(body)
                name = obj["name"]
                args = obj.get("arguments", obj.get("parameters", {}))
                if isinstance(args, str):
                    args = json.loads(args)
            if not isinstance(name, str) or not isinstance(args, dict):
                raise ValueError("name must be a string and arguments an object")
        except (ValueError, KeyError, TypeError) as e:
            log.warning("dropped a malformed tool call (%s): %.200r", e, body)
            return []
        return self.tool_call(name, args)

    def _xml(self, body: str) -> tuple[str, dict]:
        f = _FUNC.search(body)
        if not f:
            raise ValueError("no <function=...>")
        name = f.group(1).strip()
        return name, {k.strip(): self.typed_arg(name, k.strip(), v) for k, v in _PARAM.findall(f.group(2))}
