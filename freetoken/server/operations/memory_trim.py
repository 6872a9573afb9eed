"""Give the C heap back to the OS after a request with a large body. glibc keeps freed
memory in its arenas (and after one large free raises its mmap threshold, so the next
large buffer comes from the heap too): a refused 9 MB message left the server's RSS +60 MiB
for good, most of which malloc_trim(0) returns (bench/fuzz_api.py --canary, docs/reliability.md). read_body marks
the request; this ASGI middleware trims once the reply is sent, in a worker thread, at most
one trim at a time. A no-op where the C library has no malloc_trim (not glibc)."""
from __future__ import annotations

import asyncio
import ctypes
import threading

LARGE_BODY = 1 << 20          # bytes; below this the arenas' reuse is cheaper than a trim
SCOPE_KEY = "freetoken.large_body"

try:
    _malloc_trim = ctypes.CDLL(None).malloc_trim
    _malloc_trim.argtypes, _malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
except (OSError, AttributeError):
    _malloc_trim = None
_busy = threading.Lock()


def trim() -> bool:
    """malloc_trim(0) unless one is running or there is none; whether it ran."""
    if _malloc_trim is None or not _busy.acquire(blocking=False):
        return False
    try:
        _malloc_trim(0)
        return True
    finally:
        _busy.release()


def mark_large(scope, n: int) -> None:
    if n >= LARGE_BODY:
        scope[SCOPE_KEY] = True


class TrimAfterLargeBodies:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        try:
            await self.app(scope, receive, send)
        finally:
            if scope.get(SCOPE_KEY):
                await asyncio.to_thread(trim)
