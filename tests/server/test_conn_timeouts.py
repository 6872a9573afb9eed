"""Slowloris and silent connections are closed after a bounded time (serve --idle-timeout-s,
--header-timeout-s, --body-timeout-s) while a concurrent stream keeps flowing. Raw sockets
against a live uvicorn server configured as `serve` configures it."""
from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
import uvicorn

from freetoken.server.guards.conn_timeouts import ConnTimeouts, guarded_protocol
from freetoken.server.operations.shutdown import uvicorn_config

from fake_engine import FakeEngine
from live_server import LiveServer, make_fake

LIMITS = ConnTimeouts(header_s=1.0, body_s=1.0, idle_s=1.0)
BOUND_S = 8.0        # generous: the deadline is 1 s, checked every 0.25 s, on a loaded machine


def h11_config(app, dropped, **kw):
    from uvicorn.protocols.http.h11_impl import H11Protocol
    return uvicorn.Config(app, http=guarded_protocol(LIMITS, dropped.append, base=H11Protocol),
                          timeout_keep_alive=LIMITS.idle_s, **kw)


@pytest.fixture(scope="module", params=["auto", "h11"])
def guarded(request):
    """The protocol `serve` uses (httptools when installed), and uvicorn's h11 one."""
    engine = FakeEngine(chars_per_step=1, step_delay=0.01)
    engine.scripts["CANARY?"] = "c" * 600           # about 6 s of tokens
    _, svc, app = make_fake(engine, max_running=8, max_waiting=8)
    dropped = []
    config = (lambda kw: uvicorn_config(app, 2, LIMITS, dropped.append, **kw)) if request.param == "auto" \
        else (lambda kw: h11_config(app, dropped, **kw))
    srv = LiveServer(app, make_server=lambda kw: uvicorn.Server(config(kw)))
    yield srv, svc, dropped
    srv.stop()


def connect(srv) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=BOUND_S + 5)
    return s


def closed_within(s: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """(the server closed it within `seconds`, what it sent before closing)."""
    s.settimeout(0.2)
    got, deadline = b"", time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = s.recv(4096)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return True, got
        if not chunk:
            return True, got
        got += chunk
    return False, got


def test_silent_connection_is_closed(guarded):
    srv, _, dropped = guarded
    s = connect(srv)
    closed, got = closed_within(s, BOUND_S)
    assert closed and got == b""
    assert "idle" in dropped


def test_headers_one_byte_at_a_time_get_408(guarded):
    srv, _, dropped = guarded
    s = connect(srv)
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 1000
    t0, sent = time.monotonic(), 0
    while time.monotonic() - t0 < BOUND_S and sent < len(request):
        try:
            s.sendall(request[sent:sent + 1])
        except (BrokenPipeError, ConnectionResetError):
            break
        sent += 1
        s.settimeout(0.3)
        try:
            if s.recv(4096, socket.MSG_PEEK) is not None:
                break
        except socket.timeout:
            pass
    closed, got = closed_within(s, BOUND_S)
    assert closed and got.startswith(b"HTTP/1.1 408"), got[:80]
    assert sent < len(request), "the dribble was never cut"
    assert "headers" in dropped


def test_keep_alive_then_dribble_is_cut(guarded):
    """A byte after a finished request cancels uvicorn's keep-alive timer; ours still runs."""
    srv, _, _ = guarded
    s = connect(srv)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    s.settimeout(5)
    assert s.recv(4096).startswith(b"HTTP/1.1 200")
    s.sendall(b"G")
    closed, got = closed_within(s, BOUND_S)
    assert closed and got.startswith(b"HTTP/1.1 408")


def test_oversized_headers_get_431(guarded):
    srv, _, _ = guarded
    s = connect(srv)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (LIMITS.max_header_bytes + 10))
    closed, got = closed_within(s, BOUND_S)
    # h11 refuses past its own 16 KiB limit first (uvicorn answers that 400)
    assert closed and got[:12] in (b"HTTP/1.1 431", b"HTTP/1.1 400"), got[:80]


def test_body_that_stops_midway_is_dropped_and_the_server_goes_on(guarded):
    srv, svc, dropped = guarded
    s = connect(srv)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
              b"content-length: 1000\r\n\r\n{\"model\": \"capture-model\", ")
    closed, _ = closed_within(s, BOUND_S)
    assert closed
    assert "body" in dropped
    assert svc.loop.n_running == 0 and svc.loop.n_waiting == 0
    r = httpx.post(srv.url + "/v1/chat/completions", timeout=30, json={
        "model": "capture-model", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200


def test_a_stream_keeps_flowing_beside_many_slow_clients(guarded):
    srv, _, _ = guarded
    text, errors = [], []

    def canary():
        try:
            with httpx.stream("POST", srv.url + "/v1/chat/completions", timeout=60, json={
                    "model": "capture-model", "stream": True, "max_tokens": 2000,
                    "messages": [{"role": "user", "content": "CANARY?"}]}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        text.append(line)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=canary)
    t.start()
    socks = [connect(srv) for _ in range(40)]
    for i, s in enumerate(socks):
        if i % 2:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    results = [closed_within(s, BOUND_S)[0] for s in socks]
    t.join(60)
    assert all(results), f"{results.count(False)} of {len(socks)} slow connections still open"
    assert not errors and len(text) > 100, (errors, len(text))
