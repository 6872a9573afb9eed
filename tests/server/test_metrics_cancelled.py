"""/metrics counts what a request cost even when its client leaves: the tokens generated
before the disconnect, the prompt it prefilled, and its time to first token."""
import json
import socket
import time

import httpx
import pytest
from fake_engine import FakeEngine
from live_server import LiveServer, make_fake
from prometheus_client.parser import text_string_to_metric_families


@pytest.fixture
def slow():
    engine = FakeEngine(chars_per_step=1, step_delay=0.005)
    engine.default = "z" * 5000
    engine, svc, app = make_fake(engine)
    srv = LiveServer(app)
    yield engine, srv.url, svc
    srv.stop()


def sample(url: str, name: str, labels: dict | None = None) -> float:
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in (labels or {}).items()):
                return s.value
    return 0.0


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return False


def test_stream_left_midway_is_counted(slow):
    engine, url, _ = slow
    received = 0
    with httpx.stream("POST", url + "/v1/chat/completions", json={
            "model": "capture-model", "stream": True,
            "messages": [{"role": "user", "content": "go"}]}) as r:
        for line in r.iter_lines():
            received += line.count("z")
            if received >= 40:
                break
    cancelled = {"endpoint": "chat", "finish_reason": "cancelled"}
    assert wait_for(lambda: sample(url, "freetoken_requests_total", cancelled) == 1)
    made = engine.aborted and sample(url, "freetoken_generation_tokens_total")
    assert made >= received                       # one token per character
    assert sample(url, "freetoken_time_to_first_token_seconds_count") == 1
    assert sample(url, "freetoken_prompt_tokens_total") > 0


def test_nonstream_request_cancelled_is_counted(slow):
    engine, url, _ = slow
    body = json.dumps({"model": "m", "max_tokens": 4000, "messages": [{"role": "user", "content": "go"}]})
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall((f"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
        # leave once the engine has generated some tokens (a fixed wait raced a loaded machine)
        assert wait_for(lambda: any(s["n"] > 10 for s in list(engine.seqs.values())))
    cancelled = {"endpoint": "messages", "finish_reason": "cancelled"}
    assert wait_for(lambda: sample(url, "freetoken_requests_total", cancelled) == 1)
    assert sample(url, "freetoken_generation_tokens_total") > 10
    assert sample(url, "freetoken_time_to_first_token_seconds_count") == 1
