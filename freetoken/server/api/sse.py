"""Server-sent events framing."""
from __future__ import annotations

import json


def data(obj) -> str:
    return "data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n\n"


def event(name: str, obj) -> str:
    return f"event: {name}\n" + data(obj)


DONE = "data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
