"""SIGTERM drains: running requests finish within the drain timeout; those that cannot are
ended with the protocol's error event (OpenAI: error then [DONE]; Anthropic: an error
event), never cut mid-stream; the server then stops."""
import signal
import threading
import time

import httpx
from fake_engine import FakeEngine
from live_server import LiveServer, make_fake
from sse_check import parse_sse

from freetoken.server.operations.shutdown import GracefulServer, uvicorn_config


def test_sigterm_drains_then_ends_long_streams_with_an_error_event():
    engine = FakeEngine(chars_per_step=1, step_delay=0.01)
    engine.default = "w" * 100_000                           # ~1000 s: must be ended by the drain
    engine.scripts["SHORT"] = "short answer"
    engine, svc, app = make_fake(engine)
    drain = 1.5
    srv = LiveServer(app, lambda kw: GracefulServer(uvicorn_config(app, drain, **kw), svc, drain))
    out = {}

    def stream(name, path, body):
        with httpx.stream("POST", srv.url + path, json=body, timeout=60) as r:
            out[name] = "".join(r.iter_text())

    msgs = [{"role": "user", "content": "go"}]
    threads = [
        threading.Thread(target=stream, args=("oa", "/v1/chat/completions", {
            "model": "capture-model", "stream": True, "max_tokens": 100_000, "messages": msgs})),
        threading.Thread(target=stream, args=("an", "/v1/messages", {
            "model": "claude-x", "stream": True, "max_tokens": 100_000, "messages": msgs})),
        threading.Thread(target=stream, args=("short", "/v1/chat/completions", {
            "model": "capture-model", "stream": True, "max_tokens": 100,
            "messages": [{"role": "user", "content": "SHORT"}]})),
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60                         # generous: CI machines can be loaded
    while svc.loop.n_running < 3:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    t0 = time.monotonic()
    srv.server.handle_exit(signal.SIGTERM, None)
    for t in threads:
        t.join(30)
    srv.thread.join(30)
    assert not srv.thread.is_alive(), "the server did not stop"
    assert time.monotonic() - t0 < drain + 60                # ended by the drain, not by the ~1000 s streams

    oa = [d for _, d in parse_sse(out["oa"])]
    assert oa[-1] == "[DONE]" and "shutting down" in oa[-2]["error"]["message"], oa[-3:]
    an = parse_sse(out["an"])
    assert an[-1][0] == "error" and an[-1][1]["error"]["type"] == "overloaded_error", an[-2:]
    short = [d for _, d in parse_sse(out["short"])]
    assert short[-1] == "[DONE]" and short[-2]["choices"][0]["finish_reason"] == "stop"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in short[:-1]
                   if isinstance(c, dict) and c.get("choices")) == "short answer"
