"""GLM-4.5 / 4.6 / 4.7 / 5: <think> reasoning and <tool_call> blocks whose body is the
function name followed by key/value pairs:
<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n</tool_call>
(GLM-4.7 writes the same without newlines). String values are written bare, others as JSON,
so a value is read as JSON only where the tool's schema says it is not a string."""
from __future__ import annotations

import logging
import re

from ..events import Event
from . import forced
from .base import dropped
from .qwen import QwenParser

log = logging.getLogger("freetoken.server")

_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)(?:</arg_value>|$)", re.S)


class GlmParser(QwenParser):
    # GLM's role and framing tokens: never part of an answer (a weak or random model may emit them)
    drop = ["<|user|>", "<|assistant|>", "<|system|>", "<|observation|>", "<|endoftext|>", "[gMASK]", "<sop>",
            "<tool_response>", "</tool_response>"]

    @classmethod
    def forced_call_lark(cls, calls, lit, template: str) -> str:
        """<tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n</tool_call> (GLM-4.5/4.6),
        without the newlines where the template writes them so (GLM-4.7); after the closed think
        block of the generation prompt (GLM-4.6 then writes a newline)."""
        nl = "" if "</arg_key><arg_value>" in template else "\n"
        bad = ["</arg_value>", "</tool_call>"]

        def head(key, bare):
            return " ".join((forced.text(nl), lit("<arg_key>"), forced.text(key), lit("</arg_key>"),
                             forced.text(nl), lit("<arg_value>")))

        def call(i, name, schema):
            seq, rules = forced.params(i, schema, head, "</arg_value>", lit, bad)
            return f"{forced.text(name)} {seq} {forced.text(nl)}", rules
        return (f'start: "\\n"? {lit("<tool_call>")} body {lit("</tool_call>")}\n'
                + forced.one_of(calls, call))

    def _call(self, body: str) -> list[Event]:
        body = body.strip()
        cut = body.find("<arg_key>")
        name = (body if cut < 0 else body[:cut]).strip()
        if not name or "<" in name or "\n" in name:
            dropped(log, "no function name", body)
            return []
        return self.tool_call(name, {k.strip(): self.typed_arg(name, k.strip(), v) for k, v in _PAIR.findall(body)})
