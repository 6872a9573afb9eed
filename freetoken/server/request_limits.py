"""What a request body may be before any adapter looks at it: bounded in bytes (413 as
soon as the limit is passed, never buffered whole), valid UTF-8 JSON, nested at most
MAX_DEPTH deep, with no lone surrogates (they cannot be encoded for the tokenizer).
`client_input` turns a wrong inner type found while converting a request into a 400."""
from __future__ import annotations

import contextlib
import json
import re

from starlette.requests import ClientDisconnect, Request

from .errors import APIError, BadRequest

MAX_DEPTH = 64
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
                raise _too_large(n, limit, more=True)
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone("the client left during the upload") from None
    return b"".join(chunks)


def _too_large(n: int, limit: int, more: bool = False) -> PayloadTooLarge:
    return PayloadTooLarge(f"the request body is {'over ' if more else ''}{n} bytes; this server "
                           f"accepts at most {limit} (serve --max-body-mb)")


def parse_json(raw: bytes) -> object:
    try:
        obj = json.loads(raw)
    except RecursionError:
        raise BadRequest(f"the request body is nested too deeply (at most {MAX_DEPTH} levels)") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"the request body is not valid JSON: {e}") from None
    check_json(obj)
    return obj


def check_json(obj: object) -> None:
    """Depth and lone surrogates, without recursion (the input chooses the depth)."""
    stack = [(obj, 1, "body")]
    while stack:
        v, depth, where = stack.pop()
        if isinstance(v, (dict, list)):
            if depth > MAX_DEPTH:
                raise BadRequest(f"{where}: nested more than {MAX_DEPTH} levels deep")
            items = v.items() if isinstance(v, dict) else enumerate(v)
            for k, x in items:
                if isinstance(k, str) and _SURROGATE.search(k):
                    raise _surrogate(where)
                if isinstance(x, (dict, list, str)):
                    stack.append((x, depth + 1, f"{where}.{k}" if isinstance(k, str) else f"{where}[{k}]"))
        elif isinstance(v, str) and _SURROGATE.search(v):
            raise _surrogate(where)


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
