"""Server-sent events framing."""
from __future__ import annotations

import json

# Characters JSON leaves raw (ensure_ascii=False) that many SSE clients still read as line
# breaks: httpx's aiter_lines and Python's str.splitlines (which clients use to split a
# stream) end a line at NEL, LINE SEPARATOR and PARAGRAPH SEPARATOR, cutting a data line whose
# text holds one into two halves that are not JSON. The SSE spec ends lines only at CR/LF,
# but escaped (still the same JSON string) every reader gets the whole line.
_LINE_BREAKS_JSON_KEEPS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def data(obj) -> str:
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    if "\x85" in text or "\u2028" in text or "\u2029" in text:
        text = text.translate(_LINE_BREAKS_JSON_KEEPS)
    return "data: " + text + "\n\n"


def event(name: str, obj) -> str:
    return f"event: {name}\n" + data(obj)


DONE = "data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
