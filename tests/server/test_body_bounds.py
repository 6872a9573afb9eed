"""Issue 25.1: a body that would build millions of objects is refused from its bytes,
before json.loads, and parsing/validation run off the event loop."""
import json
import threading
import time
import tracemalloc

import httpx
import pytest

from freetoken.server.errors import BadRequest
from freetoken.server.api.openai import ChatCompletionRequest
from freetoken.server.guards.request_limits import MAX_CONTAINERS, MAX_VALUES, check_counts
from freetoken.server.server_state import validate_body

HEAD = b'{"model":"capture-model","max_tokens":4,"messages":[{"role":"user","content":"hi"}],"junk":['


def junk_body(item: bytes, n: int) -> bytes:
    return HEAD + b",".join([item] * n) + b"]}"


def test_ten_million_empty_lists_refused_without_building_them():
    raw = junk_body(b"[]", 10_000_000)          # 30 MB
    tracemalloc.start()
    try:
        with pytest.raises(BadRequest, match="arrays/objects"):
            validate_body(raw, ChatCompletionRequest)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 10M lists would be >= 560 MB; blanking the strings copies the bytes (twice at the peak)
    assert peak < 3 * len(raw), peak


def test_too_many_scalars_refused():
    with pytest.raises(BadRequest, match="JSON values"):
        check_counts(junk_body(b"0", MAX_VALUES + 10))


def test_brackets_and_commas_inside_strings_do_not_count():
    text = "[{,}]" * (MAX_CONTAINERS + 10) + '\\" [[['
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    req = validate_body(json.dumps(body).encode(), ChatCompletionRequest)
    assert req.messages[0]["content"] == text


def test_unknown_fields_are_dropped_before_validation():
    body = {"model": "m", "messages": [], "junk": [[1, 2]] * 1000}
    req = validate_body(json.dumps(body).encode(), ChatCompletionRequest)
    assert not (req.model_extra or {})


def test_bounds_still_answer_400_over_http(fake):
    _, url, _ = fake
    r = httpx.post(url + "/v1/chat/completions", content=junk_body(b"[]", 2 * MAX_CONTAINERS),
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400 and "arrays/objects" in r.json()["error"]["message"], r.text[:300]
    assert httpx.get(url + "/health").json()["status"] == "ok"


def test_parsing_runs_off_the_event_loop(fake):
    """A body just under the bounds (parsed, validated) while /health keeps answering."""
    _, url, _ = fake
    raw = junk_body(b'"x"', MAX_VALUES - 1000)
    done = threading.Event()

    def post():
        httpx.post(url + "/v1/chat/completions", content=raw, timeout=120,
                   headers={"content-type": "application/json"})
        done.set()

    t = threading.Thread(target=post)
    t.start()
    answered = 0
    while not done.is_set():
        assert httpx.get(url + "/health", timeout=30).status_code == 200
        answered += 1
        time.sleep(0.01)
    t.join()
    assert answered >= 1


def test_depth_and_surrogate_errors_name_the_place():
    """The path is built only for the error, and the string scan is skipped when the bytes
    hold no \\uD800-\\uDFFF escape: same answers as a full scan (a 1M-value body once spent
    ~8 s here building a path string per value)."""
    from freetoken.server.guards.request_limits import parse_json
    cases = {b'{"a": [1, {"b": "\\ud800"}]}': "body.a[1].b: contains a lone UTF-16 surrogate",
             b'{"x\\udc00": 1}': "body: contains a lone UTF-16 surrogate",
             b'{"m": ["\xed\xa0\x80"]}': "body.m[0]: contains a lone UTF-16 surrogate",   # raw UTF-8 form
             '{"u": "x\ud800"}'.encode("utf-16-le", "surrogatepass"): "body.u: contains a lone",  # json reads UTF-16
             b'{"a":' * 65 + b"1" + b"}" * 65: "body" + ".a" * 64 + ": nested more than 64"}
    for raw, msg in cases.items():
        with pytest.raises(BadRequest) as e:
            parse_json(raw)
        assert str(e.value).startswith(msg), str(e.value)
    assert parse_json(b'{"a": "\\ud83d\\ude00", "b": "\\\\ud800"}') == {"a": "\U0001F600", "b": "\\ud800"}
    assert len(parse_json(junk_body(b'"x"', 200_000))["junk"]) == 200_000
