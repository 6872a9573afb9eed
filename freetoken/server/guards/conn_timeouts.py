"""Slow and silent clients cannot hold connections open (slowloris).

uvicorn closes a keep-alive connection that sends nothing after a response
(`timeout_keep_alive`), but not a connection that sends nothing at all, nor one that dribbles
its request line and headers a byte at a time (any byte cancels that timer), nor one that
stops half-way through its body: each holds a socket and a task forever. This wraps uvicorn's
HTTP protocol (httptools or h11, whichever it picked) with one deadline per phase of a request:

  idle     connected, nothing sent yet          -> closed after `idle_s`
  headers  first byte seen, headers incomplete  -> 408 and closed `header_s` after that byte;
                                                   431 and closed past `max_header_bytes`
  body     headers done, body incomplete        -> closed `body_s` after the headers (the app
                                                   sees a disconnect); the clock stops while
                                                   the server itself has paused reading
  app      request read, response being sent    -> no deadline here (the app's stall timeout)

The phase is read from the protocol's own request cycle (`cycle.more_body`,
`cycle.response_complete`, the same names in both uvicorn implementations), checked by one
timer per connection a few times per shortest deadline."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from uvicorn.protocols.http.auto import AutoHTTPProtocol

log = logging.getLogger("freetoken.server")

RESPONSE = {408: b"HTTP/1.1 408 Request Timeout\r\n", 431: b"HTTP/1.1 431 Request Header Fields Too Large\r\n"}


@dataclass(frozen=True)
class ConnTimeouts:
    header_s: float = 10.0
    body_s: float = 60.0
    idle_s: float = 5.0                 # also uvicorn's keep-alive timeout
    max_header_bytes: int = 64 << 10

    def __post_init__(self):
        for name in ("header_s", "body_s", "idle_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 < v < 86400):
                raise ValueError(f"{name}: expected seconds in (0, 86400), got {v!r}")

    @property
    def tick(self) -> float:
        return min(1.0, max(0.05, min(self.header_s, self.body_s, self.idle_s) / 4))


def guarded_protocol(limits: ConnTimeouts, on_timeout: Callable[[str], None] | None = None,
                     base: type = AutoHTTPProtocol) -> type:
    """A subclass of uvicorn's HTTP protocol enforcing `limits`; pass it as Config(http=...).
    on_timeout(phase) is called for every connection dropped (a metrics counter)."""

    class GuardedHTTPProtocol(base):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._ft_phase, self._ft_since = "idle", time.monotonic()
            self._ft_cycle, self._ft_header_bytes = None, 0
            self._ft_timer = self.loop.call_later(limits.tick, self._ft_check)

        def connection_lost(self, exc) -> None:
            if getattr(self, "_ft_timer", None) is not None:
                self._ft_timer.cancel()
                self._ft_timer = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._ft_between() and self._ft_phase != "headers":
                self._ft_phase, self._ft_since, self._ft_header_bytes = "headers", time.monotonic(), 0
            super().data_received(data)
            self._ft_sync()
            if self._ft_phase == "headers":
                self._ft_header_bytes += len(data)
                if self._ft_header_bytes > limits.max_header_bytes and not self.transport.is_closing():
                    self._ft_drop("headers", 431, f"request headers over {limits.max_header_bytes} bytes")

        def _ft_between(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _ft_sync(self) -> None:
            """Follow the protocol's request cycle: a new one means the headers are in."""
            cycle, now = self.cycle, time.monotonic()
            if cycle is not None and cycle is not self._ft_cycle:
                self._ft_cycle = cycle
                self._ft_phase, self._ft_since = ("app", now) if cycle.response_complete else ("body", now)
            if self._ft_phase == "body" and not cycle.more_body:
                self._ft_phase = "app"
            if self._ft_phase == "app" and cycle.response_complete:
                self._ft_phase, self._ft_since = "idle", now

        def _ft_check(self) -> None:
            self._ft_timer = None
            if self.transport is None or self.transport.is_closing():
                return
            if self.transport.get_protocol() is not self:   # handed over (a WebSocket upgrade)
                return
            self._ft_sync()
            now, phase = time.monotonic(), self._ft_phase
            if phase == "body" and self.flow.read_paused:
                self._ft_since = now            # the server is not reading: not the client's delay
            waited = now - self._ft_since
            if phase == "idle" and waited > limits.idle_s:
                return self._ft_drop(phase, None, f"sent nothing for {limits.idle_s:g} s")
            if phase == "headers" and waited > limits.header_s:
                return self._ft_drop(phase, 408, f"request headers not complete after {limits.header_s:g} s "
                                     "(--header-timeout-s)")
            if phase == "body" and waited > limits.body_s:
                return self._ft_drop(phase, None, f"request body not complete after {limits.body_s:g} s "
                                     "(--body-timeout-s)")
            self._ft_timer = self.loop.call_later(limits.tick, self._ft_check)

        def _ft_drop(self, phase: str, status: int | None, why: str) -> None:
            client = "%s:%d" % tuple(self.client[:2]) if self.client else "?"
            log.debug("closed the connection from %s: %s", client, why)
            if on_timeout is not None:
                on_timeout(phase)
            if status is not None:
                self.transport.write(RESPONSE[status] + b"content-length: 0\r\nconnection: close\r\n\r\n")
            self.transport.close()

    return GuardedHTTPProtocol
