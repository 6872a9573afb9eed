"""Concurrent streams are batched by one engine thread; a client that disconnects
cancels its request at once; metrics see it all."""
import threading
import time

import httpx
import openai
import pytest
from live_server import LiveServer, make_fake
from fake_engine import FakeEngine


@pytest.fixture(scope="module")
def slow():
    engine = FakeEngine(chars_per_step=1, step_delay=0.005)
    engine.scripts.update({f"S{i}?": f"stream number {i} says hello" for i in range(6)})
    engine.scripts["LONG?"] = "z" * 5000
    engine, svc, app = make_fake(engine, max_running=8, max_waiting=8)
    srv = LiveServer(app)
    yield engine, srv.url, svc
    srv.stop()


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return False


def test_concurrent_streams_batched_on_one_thread(slow):
    engine, url, svc = slow
    client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    results = {}

    def run(i):
        s = client.chat.completions.create(model="capture-model", stream=True,
                                           messages=[{"role": "user", "content": f"S{i}?"}])
        results[i] = "".join(c.choices[0].delta.content or "" for c in s if c.choices)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {i: f"stream number {i} says hello" for i in range(6)}
    assert engine.max_batch >= 3, "streams should be decoded together"
    assert len(engine.thread_ids) == 1, "only the engine thread may touch the engine"


def test_stream_disconnect_aborts(slow):
    engine, url, svc = slow
    before = len(engine.aborted)
    with httpx.stream("POST", url + "/v1/messages", json={
            "model": "m", "max_tokens": 4000, "stream": True,
            "messages": [{"role": "user", "content": "LONG?"}]}) as r:
        for line in r.iter_lines():
            if "text_delta" in line:
                break
    assert wait_for(lambda: len(engine.aborted) > before), "the engine request was not aborted"
    assert wait_for(lambda: svc.loop.n_running == 0 and not engine.seqs)


def test_nonstream_disconnect_aborts(slow):
    engine, url, svc = slow
    before = len(engine.aborted)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/v1/chat/completions", timeout=httpx.Timeout(5, read=0.5), json={
            "model": "capture-model", "max_tokens": 4000,
            "messages": [{"role": "user", "content": "LONG?"}]})
    assert wait_for(lambda: len(engine.aborted) > before), "the engine request was not aborted"
    assert wait_for(lambda: svc.loop.n_running == 0)


def test_metrics(slow):
    _, url, _ = slow
    httpx.post(url + "/v1/chat/completions", json={
        "model": "capture-model", "messages": [{"role": "user", "content": "S1?"}]})
    text = httpx.get(url + "/metrics").text
    for name in ("freetoken_time_to_first_token_seconds_bucket", "freetoken_decode_tokens_per_second_bucket",
                 "freetoken_prompt_tokens_total", "freetoken_generation_tokens_total",
                 "freetoken_requests_running", "freetoken_requests_waiting",
                 'freetoken_requests_total{endpoint="chat",finish_reason="stop"}',
                 'finish_reason="cancelled"', "freetoken_engine_total_hits 7.0",
                 "freetoken_engine_total_bytes_copied 1024.0", 'freetoken_engine_layer_hits{layer="1"} 3.0'):
        assert name in text, name
    h = httpx.get(url + "/health").json()
    assert h["status"] == "ok"
