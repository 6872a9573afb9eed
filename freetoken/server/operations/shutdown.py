"""Graceful stop: on SIGTERM/SIGINT the server stops accepting connections, lets running
requests finish for up to `drain_timeout` seconds, then ends the rest with a proper
protocol error event (never a stream cut mid-chunk) and exits."""
from __future__ import annotations

import errno
import logging
import socket

import uvicorn

from ..guards.conn_timeouts import ConnTimeouts, guarded_protocol
from ..guards.log_privacy import install

log = logging.getLogger("freetoken.server")


def uvicorn_config(app, drain_timeout: float, timeouts=None, on_timeout=None, **kw) -> uvicorn.Config:
    """timeouts: a ConnTimeouts (conn_timeouts.py) for slow and silent clients; default its defaults."""
    timeouts = timeouts or ConnTimeouts()
    # uvicorn cancels what is still running after timeout_graceful_shutdown: leave the
    # streams time to write their final events after the drain deadline.
    config = uvicorn.Config(app, timeout_graceful_shutdown=drain_timeout + 5,
                            http=guarded_protocol(timeouts, on_timeout), timeout_keep_alive=timeouts.idle_s, **kw)
    install()                  # after the Config: making one configures uvicorn's loggers
    return config


def bind_listener(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound before the model loads (minutes, for a large
    one): a busy port is reported at once, in one line (SystemExit)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)     # as uvicorn binds its own
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        why = ("is already in use (another server? pick one with --port)"
               if e.errno == errno.EADDRINUSE else f"cannot be bound: {e.strerror}")
        raise SystemExit(f"freetoken serve: port {port} on {host} {why}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, svc, drain_timeout: float):
        super().__init__(config)
        self.svc, self.drain_timeout = svc, drain_timeout

    def handle_exit(self, sig, frame):
        if not self.should_exit:
            n = self.svc.loop.n_running + self.svc.loop.n_waiting
            log.warning("signal %d: finishing %d in-flight requests (at most %.0fs), then stopping",
                        sig, n, self.drain_timeout)
            self.svc.loop.drain(self.drain_timeout)
        super().handle_exit(sig, frame)
        self._captured_signals.clear()   # a graceful stop exits 0 after our own cleanup
