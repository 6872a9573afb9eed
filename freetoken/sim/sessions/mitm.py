"""mitmproxy flow dumps (`mitmdump -w`): a sequence of tnetstring-encoded flows. Every
POST to .../chat/completions is one request (its JSON body: messages, tools); its reply
(JSON, or an SSE stream of chunks) is the response. All flows of one file form a session."""
from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

from .formats import Request, Session, SessionError, _assistant, _neutral, _tools


def _tnetstring(buf: bytes, pos: int):
    """-> (value, next position). Types: , bytes  ; text  # int  ^ float  ! bool  ~ null  ] list  } dict."""
    colon = buf.index(b":", pos)
    n = int(buf[pos:colon])
    start, end = colon + 1, colon + 1 + n
    data, kind = buf[start:end], buf[end:end + 1]
    nxt = end + 1
    if kind == b",":
        return data, nxt
    if kind == b";":
        return data.decode("utf-8"), nxt
    if kind == b"#":
        return int(data), nxt
    if kind == b"^":
        return float(data), nxt
    if kind == b"!":
        return data == b"true", nxt
    if kind == b"~":
        return None, nxt
    if kind in (b"]", b"}"):
        items, p = [], start
        while p < end:
            v, p = _tnetstring(buf, p)
            items.append(v)
        if kind == b"]":
            return items, nxt
        return {(k.decode() if isinstance(k, bytes) else k): v for k, v in zip(items[::2], items[1::2])}, nxt
    raise ValueError(f"unknown tnetstring type {kind!r} at byte {end}")


def _body(part: dict) -> bytes:
    content = part.get("content") or b""
    enc = next((v for k, v in (part.get("headers") or []) if _s(k).lower() == "content-encoding"), b"")
    enc = _s(enc).lower()
    if enc == "gzip":
        return gzip.decompress(content)
    if enc == "deflate":
        return zlib.decompress(content)
    return content


def _s(x) -> str:
    return x.decode("latin-1") if isinstance(x, bytes) else str(x)


def _reply(raw: bytes) -> dict | None:
    """The assistant message of a JSON completion or of an SSE stream of chunks."""
    text = raw.decode("utf-8", "replace").strip()
    if text.startswith("{"):
        msg = (json.loads(text).get("choices") or [{}])[0].get("message")
        return dict(msg, role="assistant") if msg else None
    content, reasoning, calls = [], [], {}
    for line in text.splitlines():
        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
            continue
        delta = ((json.loads(line[5:]).get("choices") or [{}])[0]).get("delta") or {}
        content.append(delta.get("content") or "")
        reasoning.append(delta.get("reasoning_content") or "")
        for tc in delta.get("tool_calls") or []:
            c = calls.setdefault(tc.get("index", 0), {"id": "", "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
            c["id"] = tc.get("id") or c["id"]
            f = tc.get("function") or {}
            c["function"]["name"] += f.get("name") or ""
            c["function"]["arguments"] += f.get("arguments") or ""
    msg = {"role": "assistant", "content": "".join(content)}
    if any(reasoning):
        msg["reasoning_content"] = "".join(reasoning)
    if calls:
        msg["tool_calls"] = [calls[k] for k in sorted(calls)]
    return msg


def read_mitm(path: Path) -> list[Session]:
    buf = path.read_bytes()
    pos, reqs, n = 0, [], 0
    while pos < len(buf):
        try:
            flow, pos = _tnetstring(buf, pos)
        except (ValueError, IndexError) as e:
            raise SessionError(f"{path}: flow {n}: not a mitmproxy tnetstring dump ({e})") from None
        n += 1
        req = (flow or {}).get("request") or {}
        if not _s(req.get("path", b"")).split("?")[0].endswith("/chat/completions"):
            continue
        where = f"{path}: flow {n - 1}"
        try:
            body = json.loads(_body(req))
            resp = (flow.get("response") or {})
            reply = _reply(_body(resp)) if resp else None
        except (ValueError, OSError, zlib.error) as e:
            raise SessionError(f"{where}: body is not a chat completion ({e})") from None
        if not isinstance(body.get("messages"), list):
            raise SessionError(f"{where}: request body has no messages list")
        reqs.append(Request(_neutral(where, body["messages"]), _tools(where, body.get("tools")),
                            _assistant(f"{where} response", reply)))
    return [Session(path.stem, "mitmproxy", reqs)]
