"""What a request body may be before any adapter looks at it: bounded in bytes (413 as
soon as the limit is passed, never buffered whole), bounded in JSON values and containers
(counted on the raw bytes before any object is built), valid UTF-8 JSON, nested at most
MAX_DEPTH deep, with no lone surrogates (they cannot be encoded for the tokenizer).
`client_input` turns a wrong inner type found while converting a request into a 400.

json.loads and pydantic hold the GIL for their whole call, so even in a worker thread a
body that builds millions of objects stalls every stream: the counts bound that work
(1M small values parse in ~0.2 s here) before it starts."""
from __future__ import annotations

import contextlib
import json
import re

from starlette.requests import ClientDisconnect, Request

from ..errors import APIError, BadRequest
from ..operations.memory_trim import mark_large

MAX_DEPTH = 64
MAX_VALUES = 1_000_000        # JSON values in one body (a 262k-token id prompt is 262k)
MAX_CONTAINERS = 100_000      # arrays and objects in one body (each costs 56-200+ bytes)
_SURROGATE = re.compile("[\ud800-\udfff]")


class PayloadTooLarge(APIError):
    status = 413


class ClientGone(Exception):
    """The client closed the connection before the reply: nothing to answer, not an error."""


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    chunks, n = [], 0
    try:
        async for chunk in request.stream():
            n += len(chunk)
            if n > limit:
                mark_large(request.scope, n)
                raise _too_large(n, limit, more=True)
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone("the client left during the upload") from None
    mark_large(request.scope, n)      # the heap is trimmed after the reply (memory_trim.py)
    return b"".join(chunks)


def _too_large(n: int, limit: int, more: bool = False) -> PayloadTooLarge:
    return PayloadTooLarge(f"the request body is {'over ' if more else ''}{n} bytes; this server "
                           f"accepts at most {limit} (serve --max-body-mb)")


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def check_counts(raw: bytes) -> None:
    """Refuse a body with more values or containers than the bounds, from its bytes alone.
    Brackets and commas counted over the raw bytes bound the true counts from above
    (strings may hold some); only when that bound is passed are the strings blanked out
    (one C-speed regex) and the exact counts taken, so text full of brackets still passes."""
    containers = raw.count(b"[") + raw.count(b"{")
    values = containers + raw.count(b",") + 1
    if containers <= MAX_CONTAINERS and values <= MAX_VALUES:
        return
    bare = _JSON_STRING.sub(b'""', raw)
    containers = bare.count(b"[") + bare.count(b"{")
    values = containers + bare.count(b",") + 1
    if containers > MAX_CONTAINERS:
        raise BadRequest(f"the request body has {containers} JSON arrays/objects; this server "
                         f"accepts at most {MAX_CONTAINERS}")
    if values > MAX_VALUES:
        raise BadRequest(f"the request body has {values} JSON values; this server accepts at "
                         f"most {MAX_VALUES}")


def parse_json(raw: bytes) -> object:
    """Bounded parse of a request body (synchronous: call it in a worker thread)."""
    check_counts(raw)
    try:
        obj = json.loads(raw)
    except RecursionError:
        raise BadRequest(f"the request body is nested too deeply (at most {MAX_DEPTH} levels)") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"the request body is not valid JSON: {e}") from None
    check_json(obj, surrogates=_may_hold_surrogates(raw))
    return obj


def check_json(obj: object, surrogates: bool = True) -> None:
    """Depth and lone surrogates, without recursion (the input chooses the depth). The path
    of a value is built only for the error (an f-string per value cost ~8 s on 1M values);
    surrogates=False skips the string scan (parse_json: the raw bytes hold no such escape)."""
    stack = [(obj, 1, None, "body")]
    while stack:
        entry = stack.pop()
        v, depth = entry[0], entry[1]
        if isinstance(v, (dict, list)):
            if depth > MAX_DEPTH:
                raise BadRequest(f"{_where(entry)}: nested more than {MAX_DEPTH} levels deep")
            items = v.items() if isinstance(v, dict) else enumerate(v)
            for k, x in items:
                if surrogates and isinstance(k, str) and _SURROGATE.search(k):
                    raise _surrogate(_where(entry))
                if isinstance(x, (dict, list)) or (surrogates and isinstance(x, str)):
                    stack.append((x, depth + 1, entry, k))
        elif isinstance(v, str) and _SURROGATE.search(v):
            raise _surrogate(_where(entry))


def _where(entry) -> str:
    keys = []
    while entry is not None:
        keys.append(entry[3])
        entry = entry[2]
    out = keys.pop()
    for k in reversed(keys):
        out += f".{k}" if isinstance(k, str) else f"[{k}]"
    return out


# A lone surrogate arrives as a \uD800-\uDFFF escape or as its 3-byte UTF-8 form ED A0-BF xx
# (json.loads decodes bytes with "surrogatepass")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def _may_hold_surrogates(raw: bytes) -> bool:
    """False only for UTF-8 bytes without either form (UTF-16/32 bodies are scanned)."""
    return json.detect_encoding(raw) != "utf-8" or _SURROGATE_ESCAPE.search(raw) is not None


def _surrogate(where: str) -> BadRequest:
    return BadRequest(f"{where}: contains a lone UTF-16 surrogate (\\ud800-\\udfff), which is not "
                      "valid Unicode text", param=where)


@contextlib.contextmanager
def client_input(where: str):
    """Converting the client's JSON: a wrong type deep inside it is the client's 400."""
    try:
        yield
    except APIError:
        raise
    except (AttributeError, TypeError, KeyError, IndexError, ValueError) as e:
        raise BadRequest(f"{where}: a field has the wrong type or shape ({type(e).__name__}: "
                         f"{str(e)[:200]})", param=where) from None
