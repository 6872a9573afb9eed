"""DeepSeek-V3/R1/V3.1, V3.2 and V4: <think> reasoning and three tool-call forms.

V3 / R1 / V3.1 special tokens:
  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
  (V3-0324 / R1: <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{json}\\n```<｜tool▁call▁end｜>)
V3.2 (`function_calls`) and V4 (`tool_calls`) DSML blocks, in plain text:
  <｜DSML｜tool_calls>\\n<｜DSML｜invoke name="NAME">\\n
  <｜DSML｜parameter name="K" string="true|false">VALUE</｜DSML｜parameter>\\n</｜DSML｜invoke>\\n</｜DSML｜tool_calls>
string="false" values are JSON. Each call is emitted when its closing marker arrives."""
from __future__ import annotations

import logging
import re

from ..events import Event
from . import forced
from .base import MarkerParser, dropped, strict_loads

log = logging.getLogger("freetoken.server")

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
DSML = "｜DSML｜"
DSML_OPEN = [f"<{DSML}function_calls>", f"<{DSML}tool_calls>"]
DSML_CLOSE = [f"</{DSML}function_calls>", f"</{DSML}tool_calls>"]
INVOKE_CLOSE = f"</{DSML}invoke>"
# chat-format tokens that are never part of an answer
DROP = ["<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
        "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>"]
_INVOKE = re.compile(rf'<{DSML}invoke name="([^"]+)">')
_PARAM = re.compile(rf'<{DSML}parameter name="([^"]+)"(?: string="(true|false)")?>(.*?)</{DSML}parameter>', re.S)
_FENCED = re.compile(r"^\s*([^\n`]+?)\s*\n?```(?:json)?\s*\n?(.*?)\n?```\s*$", re.S)


class DeepSeekParser(MarkerParser):
    call_modes = ("calls", "dsml")
    forced_calls = True

    @classmethod
    def forced_call_lark(cls, calls, lit, template: str) -> str:
        """The form the template renders: V3.2 / V4's DSML block (function_calls / tool_calls), or
        the special-token block with NAME<｜tool▁sep｜>{json} (V3.1) or, where the template fences
        the arguments (V3-0324, R1), function<｜tool▁sep｜>NAME\n```json\n{json}\n```."""
        if DSML in template:
            block = "function_calls" if "function_calls>" in template else "tool_calls"
            bad = [f"</{DSML}parameter>", INVOKE_CLOSE, *DSML_CLOSE]

            def head(key, bare):
                return forced.text(f'<{DSML}parameter name="{key}" string="{"true" if bare else "false"}">')

            def call(i, name, schema):
                seq, rules = forced.params(i, schema, head, f"</{DSML}parameter>\n", lit, bad)
                empty = ' "\\n"?' if block == "tool_calls" else ""   # V4 writes one where there are no arguments
                return " ".join((forced.text(f'<{DSML}invoke name="{name}">\n'), seq + empty,
                                 forced.text(INVOKE_CLOSE + "\n"))), rules
            return (f'start: "\\n\\n"? {forced.text(f"<{DSML}{block}>")} "\\n" body '
                    f'{forced.text(f"</{DSML}{block}>")}\n' + forced.one_of(calls, call))
        fenced = "```json" in template

        def call(i, name, schema):
            if fenced:
                head = f'"function" {lit(SEP)} {forced.text(name + chr(10) + "```json" + chr(10))}'
                return f'{head} a{i} {forced.text(chr(10) + "```")}', [f"a{i}: {forced.json_value(schema)}"]
            return f"{forced.text(name)} {lit(SEP)} a{i}", [f"a{i}: {forced.json_value(schema)}"]
        return (f"start: {lit(CALLS_BEGIN)} {lit(CALL_BEGIN)} body {lit(CALL_END)} {lit(CALLS_END)}\n"
                + forced.one_of(calls, call))

    def _markers(self) -> list[str]:
        if self.mode == "reasoning":
            return [THINK_CLOSE] + DROP
        if self.mode == "calls":
            return [CALL_END, CALLS_END]
        if self.mode == "dsml":
            return [INVOKE_CLOSE] + DSML_CLOSE
        return [CALLS_BEGIN, CALL_BEGIN, *DSML_OPEN, THINK_OPEN, THINK_CLOSE, CALLS_END, *DSML_CLOSE] + DROP

    def _call_body(self, body: str) -> list[Event]:
        return self._special_call(body) if self.mode == "calls" else self._invoke(body)

    def _next(self, m: str) -> str:
        if m in (CALLS_BEGIN, CALL_BEGIN) or (m == CALL_END and self.mode == "calls"):
            return "calls"
        if m in DSML_OPEN or (m == INVOKE_CLOSE and self.mode == "dsml"):
            return "dsml"
        if m == THINK_OPEN:
            return "reasoning"
        if m in (THINK_CLOSE, CALLS_END, *DSML_CLOSE):
            return "content"
        return self.mode                                   # a dropped chat token

    def _checked(self, name, args, body) -> list[Event]:
        if not isinstance(name, str) or not name or not isinstance(args, dict):
            dropped(log, "no name or arguments", body)
            return []
        return self.tool_call(name, args)

    def _special_call(self, body: str) -> list[Event]:
        """NAME<｜tool▁sep｜>{json} (V3.1) or function<｜tool▁sep｜>NAME ```json ...``` (V3-0324, R1)."""
        body = body.replace(CALL_BEGIN, "").strip()
        if not body:
            return []
        head, sep, rest = body.partition(SEP)
        try:
            if not sep:
                raise ValueError("no <｜tool▁sep｜>")
            fenced = _FENCED.match(rest) if head.strip() == "function" else None
            name, raw = (fenced.group(1), fenced.group(2)) if fenced else (head.strip(), rest)
            args = strict_loads(raw) if raw.strip() else {}
            if isinstance(args, str):                      # arguments rendered as a JSON string
                args = strict_loads(args)
        except ValueError as e:
            dropped(log, str(e), body)
            return []
        return self._checked(name.strip(), args, body)

    def _invoke(self, body: str) -> list[Event]:
        f = _INVOKE.search(body)
        if not f:
            if body.strip():
                dropped(log, "no name or arguments", body)
            return []
        args = {}
        for key, is_string, value in _PARAM.findall(body[f.end():]):
            if is_string == "false":
                try:
                    value = strict_loads(value)
                except ValueError:
                    pass
            args[key] = value
        return self._checked(f.group(1), args, body)
