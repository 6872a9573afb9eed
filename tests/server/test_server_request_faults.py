"""A request whose engine work raises (here: its logits processor, as a grammar's would)
fails alone against the real tiny model: a 500 in its protocol's shape, streamed or not;
a concurrent stream gets the same text as alone; the engine keeps serving, /health stays
ok and no KV block stays in use."""
import dataclasses
import threading

import httpx
import pytest
from sse_check import parse_sse

MSG = [{"role": "user", "content": "BOOM please"}]
GOOD = {"model": "capture-model", "stream": True, "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": "a long answer please"}]}


@pytest.fixture
def faulty(tiny):
    """Plant a raising logits processor in every request whose prompt says BOOM."""
    _, url, svc = tiny
    engine = svc.engine
    add = engine.add_request

    def boom(output_ids, logits):
        if len(output_ids) >= 2:
            raise ValueError("injected sampler fault")
        return logits

    def add_request(rid, ids, params, *a, **kw):
        if "BOOM" in engine.tokenizer.decode(ids):
            params = dataclasses.replace(params, logits_processors=[*params.logits_processors, boom])
        return add(rid, ids, params, *a, **kw)

    engine.add_request = add_request
    yield url, svc
    del engine.add_request


def _good_stream(url) -> str:
    with httpx.stream("POST", url + "/v1/chat/completions", json=GOOD, timeout=120) as r:
        assert r.status_code == 200
        events = [d for _, d in parse_sse(r.read().decode())]
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length", events[-3:]
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"])


def _faulty_replies(url) -> dict:
    post = lambda path, **kw: httpx.post(url + path, timeout=120, json=kw)   # noqa: E731
    oa = dict(model="capture-model", messages=MSG, max_tokens=8)
    an = dict(model="claude-x", messages=MSG, max_tokens=8)
    rs = dict(model="capture-model", input="BOOM please", max_output_tokens=8)
    return {"chat": post("/v1/chat/completions", **oa),
            "chat-stream": post("/v1/chat/completions", stream=True, **oa),
            "responses": post("/v1/responses", **rs),
            "responses-stream": post("/v1/responses", stream=True, **rs),
            "messages": post("/v1/messages", **an),
            "messages-stream": post("/v1/messages", stream=True, **an)}


def test_request_whose_sampling_raises_fails_alone_in_its_protocols_shape(faulty):
    url, svc = faulty
    alone = _good_stream(url)
    got = {}
    threads = [threading.Thread(target=lambda: got.update(good=_good_stream(url))),
               threading.Thread(target=lambda: got.update(bad=_faulty_replies(url)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert got["good"] == alone, "the concurrent stream's output changed"
    r = got["bad"]
    for name in ("chat", "responses"):
        assert r[name].status_code == 500, r[name].text
        err = r[name].json()["error"]
        assert err["type"] == "server_error" and "injected sampler fault" in err["message"], err
    assert r["messages"].status_code == 500
    body = r["messages"].json()
    assert body["type"] == "error" and body["error"]["type"] == "api_error", body
    assert "injected sampler fault" in body["error"]["message"]

    chat = [d for _, d in parse_sse(r["chat-stream"].text)]
    assert chat[-1] == "[DONE]" and "injected sampler fault" in chat[-2]["error"]["message"], chat[-3:]
    assert not any(isinstance(e, dict) and any(c.get("finish_reason") for c in e.get("choices", []))
                   for e in chat)
    resp = parse_sse(r["responses-stream"].text)
    assert resp[-1][0] == "error" and "injected sampler fault" in resp[-1][1]["message"], resp[-2:]
    msgs = parse_sse(r["messages-stream"].text)
    assert msgs[-1][0] == "error" and msgs[-1][1]["error"]["type"] == "api_error", msgs[-2:]

    assert httpx.get(url + "/health").json()["status"] == "ok"
    assert svc.loop.failures == 0
    assert _good_stream(url) == alone                       # still serving, same tokens
    eng = svc.engine
    assert not eng.seqs and eng.blocks.available == eng.blocks.num_blocks - 1
    metrics = httpx.get(url + "/metrics").text
    assert "freetoken_kv_blocks_in_use 0.0" in metrics


def test_a_forward_that_raises_even_alone_degrades_health_until_a_good_step(tiny, monkeypatch):
    _, url, svc = tiny
    runner = svc.engine.runner
    run = runner.run

    def broken(batch):
        if any("BOOM" in svc.engine.tokenizer.decode(s.prompt_ids) for s, _ in batch):
            raise RuntimeError("injected kernel fault")
        return run(batch)

    monkeypatch.setattr(runner, "run", broken)
    r = httpx.post(url + "/v1/chat/completions", timeout=120,
                   json={"model": "capture-model", "messages": MSG, "max_tokens": 4})
    assert r.status_code == 500 and "injected kernel fault" in r.json()["error"]["message"]
    h = httpx.get(url + "/health")
    assert h.status_code == 503 and "injected kernel fault" in h.json()["error"], h.text
    assert _good_stream(url)
    assert httpx.get(url + "/health").json()["status"] == "ok"
    eng = svc.engine
    assert not eng.seqs and eng.blocks.available == eng.blocks.num_blocks - 1
