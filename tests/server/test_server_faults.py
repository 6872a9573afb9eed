"""Client and engine faults over the scripted engine: clients that leave (while uploading,
while waiting for a non-streamed reply) are cancellations, not 500s or tracebacks; an
engine error ends an OpenAI stream with the error and [DONE] and nothing after it."""
import json
import logging
import socket
import time

import httpx
import pytest
from fake_engine import FakeEngine
from live_server import LiveServer, make_fake
from sse_check import parse_sse

OA = "/v1/chat/completions"


class FailingEngine(FakeEngine):
    """Its step raises whenever a running prompt asks for it."""

    def step(self):
        if any(s["boom"] and not s["abort"] for s in self.seqs.values()):
            raise RuntimeError("kernel exploded")
        return super().step()

    def add_request(self, request_id, prompt_token_ids, params):
        super().add_request(request_id, prompt_token_ids, params)
        self.seqs[request_id]["boom"] = "BOOM" in self.tokenizer.decode(prompt_token_ids)


@pytest.fixture(scope="module")
def server():
    engine = FailingEngine(chars_per_step=1, step_delay=0.02)
    engine.default = "y" * 300
    engine, svc, app = make_fake(engine)
    srv = LiveServer(app)
    yield engine, srv.url, svc
    srv.stop()


def metric(url, name):
    total = 0.0
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def body(content="hi", **kw):
    return {"model": "capture-model", "messages": [{"role": "user", "content": content}], **kw}


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_nonstream_client_that_leaves_is_cancelled_quietly(server):
    engine, url, svc = server
    before = metric(url, 'freetoken_requests_total{endpoint="chat",finish_reason="cancelled"}')
    seen = Records()
    loggers = [logging.getLogger(n) for n in ("uvicorn.error", "uvicorn", "freetoken")]
    for lg in loggers:
        lg.addHandler(seen)
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + OA, json=body(max_tokens=300), timeout=0.3)
        deadline = time.monotonic() + 10
        while metric(url, 'freetoken_requests_total{endpoint="chat",finish_reason="cancelled"}') == before:
            assert time.monotonic() < deadline, "the cancellation was not counted"
            time.sleep(0.05)
        time.sleep(0.2)
    finally:
        for lg in loggers:
            lg.removeHandler(seen)
    assert not [r for r in seen.records if r.levelno >= logging.ERROR or r.exc_info], \
        [r.getMessage() for r in seen.records]
    assert metric(url, 'freetoken_http_errors_total{status="500"}') == 0
    assert not engine.seqs or all(s["abort"] for s in engine.seqs.values())


def test_client_that_drops_mid_upload_is_not_a_500(server):
    _, url, _ = server
    port = int(url.rsplit(":", 1)[1])
    for _ in range(5):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100000\r\n\r\n{\"model\": \"capture-model\", ")
        time.sleep(0.05)
        s.close()
    time.sleep(0.3)
    assert metric(url, 'freetoken_http_errors_total{status="500"}') == 0
    assert httpx.post(url + OA, json=body(max_tokens=3), timeout=30).status_code == 200


@pytest.mark.parametrize("path,payload", [
    (OA, body("BOOM", stream=True, max_tokens=50)),
    ("/v1/completions", {"model": "capture-model", "prompt": "BOOM", "stream": True, "max_tokens": 50})])
def test_stream_error_is_the_last_event(server, path, payload):
    _, url, _ = server
    r = httpx.post(url + path, json=payload, timeout=30)
    events = [d for _, d in parse_sse(r.text)]
    assert events[-1] == "[DONE]"
    assert "error" in events[-2] and "kernel exploded" in events[-2]["error"]["message"], events[-3:]
    assert not any(isinstance(e, dict) and any(c.get("finish_reason") for c in e.get("choices", []))
                   for e in events), "no finish_reason may follow (or stand in for) the error"
    assert httpx.post(url + OA, json=body(max_tokens=3), timeout=30).status_code == 200


def test_health_reports_engine_failures_and_recovers(server):
    _, url, _ = server
    assert httpx.head(url + "/health").status_code == 200
    httpx.post(url + OA, json=body("BOOM", max_tokens=20), timeout=30)
    h = httpx.get(url + "/health")
    assert h.status_code == 503 and h.json()["status"] == "degraded", h.text
    assert "kernel exploded" in h.json()["error"]
    assert httpx.head(url + "/health").status_code == 503
    assert metric(url, "freetoken_engine_step_failures_total") >= 1
    assert httpx.post(url + OA, json=body(max_tokens=3), timeout=30).status_code == 200
    assert httpx.get(url + "/health").json()["status"] == "ok"


def test_client_that_stops_reading_is_aborted_and_others_keep_going():
    engine = FakeEngine(chars_per_step=4000, step_delay=0.002, max_model_len=1 << 27)
    engine.default = "z" * 40_000_000      # 10,000 steps, 40 MB: more than any socket buffers
    engine, svc, app = make_fake(engine, stall_timeout=0.5)
    srv = LiveServer(app)
    try:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", srv.port))
        req = json.dumps(body("stall", stream=True, max_tokens=50_000_000)).encode()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(req), req))     # ...and never read
        deadline = time.monotonic() + 30
        while not engine.aborted:
            assert time.monotonic() < deadline and not engine.finished, "the stalled request kept generating"
            time.sleep(0.05)
        assert metric(srv.url, "freetoken_stalled_clients_total") == 1
        r = httpx.post(srv.url + OA, json=body(max_tokens=5, stream=True), timeout=30)
        assert r.status_code == 200 and r.text.rstrip().endswith("[DONE]")
        s.close()
    finally:
        srv.stop()
