"""gpt-oss harmony: messages `<|channel|>C[ to=R][ <|constrain|>json]<|message|>BODY<|end|>`;
analysis -> reasoning, final / commentary -> text, commentary to=functions.NAME -> tool call
(ended by <|call|>)."""
from __future__ import annotations

import logging
import re

from ..events import Event, ReasoningDelta, TextDelta
from . import forced
from .base import Parser, WhitespaceHold, dropped, find_first, held_suffix, strict_loads

log = logging.getLogger("freetoken.server")

MESSAGE = "<|message|>"
ENDS = ["<|end|>", "<|call|>", "<|return|>"]
HEADER_END = [MESSAGE] + ENDS


class HarmonyParser(Parser):
    forced_calls = True

    @classmethod
    def forced_call_lark(cls, calls, lit, template: str) -> str:
        """After the generation prompt's <|start|>assistant: a commentary message to
        functions.NAME with JSON arguments, ended by <|call|>; the header either as the model
        writes it (<|channel|>commentary to=functions.NAME <|constrain|>json) or as the template
        renders a past call ( to=functions.NAME<|channel|>commentary json)."""
        ch, msg = lit("<|channel|>"), lit(MESSAGE)

        def call(i, name, schema):
            to = f"to=functions.{name}"
            model = f'{ch} {forced.text(f"commentary {to} ")} {lit("<|constrain|>")} "json"'
            rendered = f'{forced.text(" " + to)} {ch} "commentary json"'
            return f"(({model}) | ({rendered})) {msg} a{i} {lit('<|call|>')}", [f"a{i}: {forced.json_value(schema)}"]
        return "start: body\n" + forced.one_of(calls, call)

    def __init__(self, tools: list[dict] | None = None, reasoning: bool = False):
        super().__init__(tools)
        self.buf = ""
        self.in_body = False
        self.channel, self.recipient = "final", None
        self.args = ""
        self.text = WhitespaceHold(TextDelta)
        self.thought = WhitespaceHold(ReasoningDelta)

    def _sink(self) -> WhitespaceHold | None:
        if self.recipient:
            return None
        return self.thought if self.channel == "analysis" else self.text

    def _body(self, s: str, out: list[Event]) -> None:
        sink = self._sink()
        if sink is None:
            self.args += s
        else:
            sink.push(s, out)

    def _header(self, h: str) -> None:
        h = re.sub(r"<\|start\|>|<\|constrain\|>", " ", h)
        m = re.search(r"<\|channel\|>\s*(\w+)", h)
        self.channel = m.group(1) if m else "final"
        r = re.search(r"to=([^\s<]+)", h)
        self.recipient = r.group(1) if r else None
        self.args = ""

    def _end_body(self, out: list[Event]) -> None:
        if self.recipient:
            name = self.recipient.removeprefix("functions.")
            try:
                args = strict_loads(self.args) if self.args.strip() else {}
                if not isinstance(args, dict):
                    raise ValueError("arguments must be an object")
                out += self.tool_call(name, args)
            except ValueError as e:
                dropped(log, str(e), self.args)
        self.thought.ws = ""
        self.text.ws = ""
        self.recipient, self.args = None, ""

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        self.buf += text
        while True:
            if not self.in_body:
                i, m = find_first(self.buf, HEADER_END)
                if m is None:
                    return out
                if m == MESSAGE:
                    self._header(self.buf[:i])
                    self.in_body = True
                self.buf = self.buf[i + len(m):]
                continue
            i, m = find_first(self.buf, ENDS)
            if m is None:
                keep = held_suffix(self.buf, ENDS)
                self._body(self.buf[:len(self.buf) - keep], out)
                self.buf = self.buf[len(self.buf) - keep:]
                return out
            self._body(self.buf[:i], out)
            self._end_body(out)
            self.buf = self.buf[i + len(m):]
            self.in_body = False

    def finish(self, truncated: bool = False) -> list[Event]:
        out: list[Event] = []
        if self.in_body:
            self._body(self.buf, out)
            self._end_body(out)
        self.buf = ""
        return out
