"""Streaming output parsers: model text in, neutral events out.

A parser is fed the detokenized output piece by piece and must give the same events
however the text is split. Markup that might still turn into a marker is held back.
"""
from __future__ import annotations

import json
import logging
import uuid

from ..events import Event, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart


def _non_finite(token: str):
    raise ValueError(f"{token} is not a JSON number")


def _finite_float(token: str) -> float | str:
    x = float(token)
    return x if x - x == 0 else token        # 1e999 reads as inf: keep the digits as a string


def strict_loads(text: str):
    """JSON as the model wrote it, with only what strict JSON allows: NaN/Infinity are refused
    (ValueError), a number too large for a float (1e999) is kept as its text, so every tool
    argument re-serializes as strict JSON (json.dumps(allow_nan=False))."""
    return json.loads(text, parse_constant=_non_finite, parse_float=_finite_float)


def is_bare_string(schema) -> bool:
    """Whether the key/value forms (GLM, MiniMax, DSML, Qwen3-Coder) write a parameter of this
    schema as bare text: a string, or a schema that says nothing of its type; a $ref, a
    combination, an object or array shape or a non-string enum / const is JSON."""
    if not isinstance(schema, dict):
        return True
    if "type" in schema:
        return schema["type"] == "string"
    if "enum" in schema or "const" in schema:
        return all(isinstance(e, str) for e in schema.get("enum", [schema.get("const", "")]))
    return not any(k in schema for k in ("$ref", "anyOf", "oneOf", "allOf", "properties", "items"))


def dropped(log, why: str, body: str) -> None:
    """Log a dropped tool call by its size only: generated text stays out of the logs."""
    log.warning("dropped a malformed tool call (%s; %d characters)", why, len(body))


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def find_first(buf: str, markers: list[str]) -> tuple[int, str | None]:
    best, found = -1, None
    for m in markers:
        i = buf.find(m)
        if i >= 0 and (best < 0 or i < best):
            best, found = i, m
    return best, found


def held_suffix(buf: str, markers: list[str]) -> int:
    """Length of the longest tail of buf that is a proper prefix of some marker."""
    n = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(buf)), n, -1):
            if buf.endswith(m[:k]):
                n = k
                break
    return n


class Parser:
    """Base: all text is visible text. Subclasses add reasoning and tool-call markup."""

    # whether `forced_call_lark` writes this family's call markup (tool_choice required / named)
    forced_calls = False

    @classmethod
    def forced_call_lark(cls, calls: list[tuple[str, dict]], lit, template: str) -> str:
        """A lark grammar (llguidance syntax, `start` rule) of exactly one call to one of `calls`
        (name, parameters schema), in the markup the checkpoint's chat `template` renders and this
        parser reads back; `lit(tag)` is a tag's terminal (see forced.py)."""
        raise NotImplementedError

    def __init__(self, tools: list[dict] | None = None, reasoning: bool = False):
        self.tools = {t["function"]["name"]: t["function"] for t in tools or [] if "function" in t}
        self.n_calls = 0

    def feed(self, text: str) -> list[Event]:
        return [TextDelta(text)] if text else []

    def finish(self, truncated: bool = False) -> list[Event]:
        """The end of the output; `truncated`: the token budget ended it (not the model)."""
        return []

    def typed_arg(self, tool: str, key: str, value: str):
        """A tool argument written as bare text: kept as text where the tool's schema says string
        (or says nothing), else read as JSON (numbers, booleans, objects, a $ref), falling back to text."""
        props = (self.tools.get(tool, {}).get("parameters") or {}).get("properties") or {}
        if is_bare_string(props.get(key)):
            return value
        try:
            return strict_loads(value)
        except ValueError:
            return value

    def tool_call(self, name: str, arguments: dict | str) -> list[Event]:
        try:
            args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False,
                                                                            allow_nan=False)
        except ValueError as e:                 # a non-finite float: this call alone is dropped
            dropped(logging.getLogger("freetoken.server"), str(e), str(arguments))
            return []
        i = self.n_calls
        self.n_calls += 1
        return [ToolCallStart(i, new_call_id(), name), ToolCallDelta(i, args), ToolCallEnd(i, args)]

    def truncated_call(self, name: str, arguments_text: str) -> list[Event]:
        """A call the token budget cut off: its arguments as far as they were written (not
        valid JSON in general); the finish reason "length" tells the client."""
        return self.tool_call(name, arguments_text)


class MarkerParser(Parser):
    """Text streamed through modes that markers switch: "content" and "reasoning" are shown
    (with a possibly partial marker held back at the end of the buffer), the modes in
    `call_modes` collect a tool-call body, handed to `_call_body` when its closing marker (or
    the end of the stream) arrives. Subclasses give `_markers()` (what ends the current mode)
    and `_next(marker)` (the mode after it)."""

    call_modes: tuple[str, ...] = ()

    def __init__(self, tools: list[dict] | None = None, reasoning: bool = False):
        super().__init__(tools)
        self.mode = "reasoning" if reasoning else "content"
        self.buf = ""
        self.text = WhitespaceHold(TextDelta)
        self.thought = WhitespaceHold(ReasoningDelta)

    def _markers(self) -> list[str]:
        raise NotImplementedError

    def _next(self, marker: str) -> str:
        raise NotImplementedError

    def _call_body(self, body: str) -> list[Event]:
        raise NotImplementedError

    def _emit(self, s: str, out: list[Event]) -> None:
        if self.mode == "reasoning":
            self.thought.push(s, out)
        elif self.mode == "content":
            self.text.push(s, out)

    def _flush(self, body: str, out: list[Event]) -> None:
        if self.mode in self.call_modes:
            out += self._call_body(body)
            self.text.ws = ""                 # no stray whitespace between a call and what follows
        else:
            self._emit(body, out)

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        self.buf += text
        while True:
            markers = self._markers()
            i, m = find_first(self.buf, markers)
            if m is None:
                if self.mode not in self.call_modes:
                    keep = held_suffix(self.buf, markers)
                    self._emit(self.buf[:len(self.buf) - keep], out)
                    self.buf = self.buf[len(self.buf) - keep:]
                return out
            body, self.buf = self.buf[:i], self.buf[i + len(m):]
            self._flush(body, out)
            self.mode = self._next(m)

    def _partial_call(self, body: str) -> list[Event]:
        """A call body the token budget cut off (subclasses that can read one return it)."""
        return self._call_body(body)

    def finish(self, truncated: bool = False) -> list[Event]:
        out: list[Event] = []
        if truncated and self.mode in self.call_modes:
            out += self._partial_call(self.buf)
        else:
            self._flush(self.buf, out)
        self.buf = ""
        return out


class WhitespaceHold:
    """Emits text but holds trailing whitespace until more text follows; drops leading
    whitespace at the start of a section, so markup boundaries never leave stray newlines."""

    def __init__(self, kind: type):
        self.kind = kind
        self.ws = ""
        self.started = False

    def push(self, s: str, out: list[Event]) -> None:
        if not self.started:
            s = s.lstrip()
        if not s:
            return
        s = self.ws + s
        body = s.rstrip()
        self.ws = s[len(body):]
        if body:
            out.append(self.kind(body))
            self.started = True

    def reset(self) -> None:
        self.ws = ""
        self.started = False
