"""Reliability regressions against the real tiny model: one request's bad numbers fail
that request alone (or are clamped), and the server keeps serving."""
import json
import threading

import httpx

OA = "/v1/chat/completions"


def chat(url, raw: str = "", **kw):
    body = {"model": "capture-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    body.update(kw)
    content = json.dumps(body)[:-1] + raw + "}"     # raw: JSON a dict cannot hold (1e400, NaN)
    return httpx.post(url + OA, content=content, timeout=120,
                      headers={"content-type": "application/json"})


def test_extreme_sampling_does_not_fail_other_requests(tiny):
    _, url, _ = tiny
    results = {}

    def other():
        with httpx.stream("POST", url + OA, timeout=120, json={
                "model": "capture-model", "stream": True, "max_tokens": 8,
                "messages": [{"role": "user", "content": "a long answer please"}]}) as r:
            results["stream"] = (r.status_code, r.read().decode())

    t = threading.Thread(target=other)
    t.start()
    for kw in ({"temperature": 1e-300}, {"temperature": 1e-44}, {"temperature": 1e-3, "top_p": 1e-9}):
        r = chat(url, **kw)
        assert r.status_code == 200, (kw, r.text)
        assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    for raw, kw in (("", {"repetition_penalty": 1e-300}), (', "temperature": 1e400', {}),
                    (', "top_p": NaN', {}), ("", {"seed": 2**70})):
        r = chat(url, raw, **kw)
        assert r.status_code == 400, (kw, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error"
    t.join(120)
    status, text = results["stream"]
    assert status == 200 and "engine error" not in text and text.rstrip().endswith("data: [DONE]")
    assert httpx.get(url + "/health").json()["status"] == "ok"


def test_oversized_message_is_refused_without_tokenizing_it_all(tiny):
    _, url, svc = tiny
    calls = []
    encode = svc.tokenizer.encode

    def counting(text, *a, **kw):
        calls.append(len(text))
        return encode(text, *a, **kw)

    svc.tokenizer.encode = counting
    try:
        big = "the quick brown fox jumps over the lazy dog. " * 180_000       # 8 MB
        r = chat(url, messages=[{"role": "user", "content": big}])
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text[:300]
        assert sum(calls) < len(big) // 4, sum(calls)
        r = httpx.post(url + "/v1/messages/count_tokens", timeout=120, json={
            "model": "m", "messages": [{"role": "user", "content": big}]})
        assert r.status_code == 200 and r.json()["input_tokens"] > svc.max_model_len
    finally:
        del svc.tokenizer.encode
    assert chat(url).status_code == 200


def test_metrics_show_kv_blocks_and_preemptions(tiny):
    _, url, svc = tiny
    assert chat(url).status_code == 200
    text = httpx.get(url + "/metrics").text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    assert values["freetoken_kv_blocks_total"] == svc.engine.blocks.num_blocks - 1 > 0
    assert values["freetoken_kv_blocks_in_use"] == 0          # idle: every block is back
    assert "freetoken_preemptions_total" in values and "freetoken_kv_evictions" in values
    h = httpx.get(url + "/health").json()
    assert h["kv_blocks_in_use"] == 0 and h["kv_blocks_total"] > 0
