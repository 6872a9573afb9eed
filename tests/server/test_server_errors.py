"""Every error class answers 4xx/5xx in the protocol's own body shape, and the server
keeps serving afterwards."""
import threading
import time

import httpx
import pytest
from live_server import LiveServer, make_fake
from fake_engine import FakeEngine

KEY = {"Authorization": "Bearer secret"}
OA = "/v1/chat/completions"
AN = "/v1/messages"
MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def small():
    engine = FakeEngine(max_model_len=300, chars_per_step=1, step_delay=0.01)
    engine.default = "x" * 400
    engine, svc, app = make_fake(engine, api_key="secret", max_running=1, max_waiting=1)
    srv = LiveServer(app)
    yield engine, srv.url, svc
    srv.stop()


def oa_error(r, status, code=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"] and "type" in err
    if code:
        assert err["code"] == code
    return err


def an_error(r, status, kind):
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind and body["error"]["message"]
    return body["error"]


def post(url, path, body=None, content=None, headers=KEY):
    return httpx.post(url + path, json=body, content=content, headers=headers, timeout=30)


def test_malformed_json(small):
    url = small[1]
    oa_error(post(url, OA, content=b'{"model": "capture-model", "messages": [', headers={
        **KEY, "content-type": "application/json"}), 400)
    an_error(post(url, AN, content=b"{not json", headers={**KEY, "content-type": "application/json"}),
             400, "invalid_request_error")


def test_wrong_types(small):
    url = small[1]
    oa_error(post(url, OA, {"model": "capture-model", "messages": "hi"}), 400)
    oa_error(post(url, OA, {"model": "capture-model", "messages": MSG, "max_tokens": "many"}), 400)
    oa_error(post(url, OA, {"model": "capture-model", "messages": [{"content": "no role"}]}), 400)
    oa_error(post(url, OA, {"model": "capture-model", "messages": MSG, "temperature": -1}), 400)
    an_error(post(url, AN, {"model": "m", "messages": MSG}), 400, "invalid_request_error")  # no max_tokens
    an_error(post(url, AN, {"model": "m", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}),
             400, "invalid_request_error")


def test_unknown_model(small):
    url = small[1]
    oa_error(post(url, OA, {"model": "gpt-9", "messages": MSG, "max_tokens": 1}), 404, "model_not_found")
    r = post(url, AN, {"model": "claude-opus-5-5", "max_tokens": 1, "messages": MSG})
    assert r.status_code == 200  # Anthropic ids map to the served model


def test_context_overflow(small):
    url = small[1]
    long = [{"role": "user", "content": "word " * 200}]
    oa_error(post(url, OA, {"model": "capture-model", "messages": long}), 400, "context_length_exceeded")
    an_error(post(url, AN, {"model": "m", "max_tokens": 5, "messages": long}), 400, "invalid_request_error")


def test_max_tokens_limits(small):
    _, url, svc = small
    oa_error(post(url, OA, {"model": "capture-model", "messages": MSG, "max_tokens": 0}), 400)
    an_error(post(url, AN, {"model": "m", "max_tokens": 0, "messages": MSG}), 400, "invalid_request_error")
    # default: over-large requests (agents send 32k-128k) are lowered to what fits
    r = post(url, AN, {"model": "m", "max_tokens": 128000, "messages": MSG, "stop_sequences": ["x"]})
    assert r.status_code == 200
    svc.strict_max_tokens = True
    try:
        err = oa_error(post(url, OA, {"model": "capture-model", "messages": MSG, "max_tokens": 5000}), 400)
        assert "max_tokens" in err["message"]
        an_error(post(url, AN, {"model": "m", "max_tokens": 5000, "messages": MSG}), 400,
                 "invalid_request_error")
    finally:
        svc.strict_max_tokens = False


def test_bad_tool_schema(small):
    url = small[1]
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]
    oa_error(post(url, OA, {"model": "capture-model", "messages": MSG, "tools": bad}), 400)
    bad_name = [{"type": "function", "function": {"name": "has spaces", "parameters": {"type": "object"}}}]
    oa_error(post(url, OA, {"model": "capture-model", "messages": MSG, "tools": bad_name}), 400)
    an_error(post(url, AN, {"model": "m", "max_tokens": 5, "messages": MSG, "tools": [{"name": "f"}]}),
             400, "invalid_request_error")
    an_error(post(url, AN, {"model": "m", "max_tokens": 5, "messages": MSG,
                            "tools": [{"name": "f", "input_schema": {"type": "object", "properties": []}}]}),
             400, "invalid_request_error")


def test_api_key(small):
    url = small[1]
    oa_error(post(url, OA, {"model": "capture-model", "messages": MSG}, headers={}), 401)
    oa_error(httpx.get(url + "/v1/models", headers={"Authorization": "Bearer wrong"}), 401)
    an_error(post(url, AN, {"model": "m", "max_tokens": 1, "messages": MSG}, headers={"x-api-key": "no"}),
             401, "authentication_error")
    assert httpx.get(url + "/v1/models", headers={"x-api-key": "secret"}).status_code == 200
    assert httpx.get(url + "/v1/models", headers=KEY).status_code == 200
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/metrics").status_code == 401


def test_unknown_route_and_unsupported(small):
    url = small[1]
    oa_error(httpx.get(url + "/v1/nothing", headers=KEY), 404)
    oa_error(post(url, OA, {"model": "capture-model", "messages": MSG, "n": 2}), 400)
    oa_error(post(url, "/v1/responses", {"model": "capture-model", "input": "x",
                                         "previous_response_id": "resp_1"}), 400)


def test_queue_full_429_with_retry_after(small):
    engine, url, svc = small
    streams, opened = [], []

    def hold():
        with httpx.stream("POST", url + OA, headers=KEY, timeout=30, json={
                "model": "capture-model", "messages": MSG, "stream": True, "max_tokens": 200}) as r:
            opened.append(r.status_code)
            for _ in r.iter_lines():
                pass
    for _ in range(2):          # one running, one waiting: the queue is full
        t = threading.Thread(target=hold)
        t.start()
        streams.append(t)
    deadline = time.monotonic() + 10
    while len(opened) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert opened == [200, 200]
    r = post(url, OA, {"model": "capture-model", "messages": MSG, "max_tokens": 1})
    oa_error(r, 429)
    assert int(r.headers["retry-after"]) >= 1
    r = post(url, AN, {"model": "m", "max_tokens": 1, "messages": MSG})
    an_error(r, 429, "rate_limit_error")
    assert "retry-after" in r.headers
    for t in streams:
        t.join(30)
    # and the server keeps serving
    r = post(url, OA, {"model": "capture-model", "messages": MSG, "max_tokens": 2})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"


class ExplodingEngine(FakeEngine):
    def step(self):
        if any(s["text"] == "BOOM" for s in self.seqs.values()):
            for s in self.seqs.values():
                s["text"] = "fine"
            raise RuntimeError("kernel exploded")
        return super().step()


def test_engine_failure_is_reported_and_server_survives():
    engine = ExplodingEngine()
    engine.scripts["BOOM?"] = "BOOM"
    engine, svc, app = make_fake(engine)
    srv = LiveServer(app)
    try:
        boom = [{"role": "user", "content": "BOOM?"}]
        r = httpx.post(srv.url + OA, json={"model": "capture-model", "messages": boom}, timeout=30)
        assert r.status_code == 500 and "kernel exploded" in r.json()["error"]["message"]
        engine.seqs.clear()
        r = httpx.post(srv.url + AN, json={"model": "m", "max_tokens": 50, "stream": True, "messages": boom},
                       timeout=30)
        assert "event: error" in r.text and "kernel exploded" in r.text
        engine.seqs.clear()
        r = httpx.post(srv.url + OA, json={"model": "capture-model", "messages": MSG}, timeout=30)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
        assert httpx.get(srv.url + "/health").json()["status"] == "ok"
    finally:
        srv.stop()
