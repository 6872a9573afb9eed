"""A schema no finite value satisfies never ends as a normal "stop" (issue 36): the probe's
$ref cycle through `required` is a 400 before generation, and when a grammar still cannot
finish (here: the same schema with the static check switched off, so llguidance meets it
mid-output) the answer ends with finish_reason "constraint_failed", plus an error event in
streams. Real tiny model."""
from __future__ import annotations

import json

import httpx
import pytest

from freetoken.server import grammar

CYCLE = {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "required": ["a"],
         "$defs": {"A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B"}}, "required": ["b"]},
                   "B": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "required": ["a"]}}}


def body(stream=False, **kw):
    return {"model": "capture-model", "max_tokens": 64, "stream": stream, "temperature": 0,
            "messages": [{"role": "user", "content": "json please"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": CYCLE}}, **kw}


@pytest.fixture
def uncapped(tiny):
    svc = tiny[2]
    svc.max_tokens_cap = None
    yield tiny
    svc.max_tokens_cap = 8


def test_required_cycle_is_a_400_before_generation(tiny):
    r = httpx.post(tiny[1] + "/v1/chat/completions", json=body(), timeout=60)
    assert r.status_code == 400, r.text
    assert "describes no value" in r.json()["error"]["message"]


@pytest.fixture
def unchecked(monkeypatch):
    """What the static check cannot see reaches the grammar: simulate it with this schema."""
    monkeypatch.setattr(grammar, "check_schema", lambda *a, **k: None)


def test_a_grammar_that_cannot_finish_says_so(uncapped, unchecked):
    r = httpx.post(uncapped[1] + "/v1/chat/completions", json=body(), timeout=120)
    if r.status_code == 400:           # llguidance saw it at the first mask: a 400 is fine too
        pytest.skip(f"llguidance refused it up front: {r.text[:200]}")
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "constraint_failed", ch
    with pytest.raises(ValueError):
        json.loads(ch["message"]["content"] or "")          # the half answer is not passed off as whole


def test_stream_ends_with_the_reason_and_an_error_event(uncapped, unchecked):
    lines = []
    with httpx.stream("POST", uncapped[1] + "/v1/chat/completions", json=body(stream=True), timeout=120) as r:
        if r.status_code == 400:
            pytest.skip("llguidance refused it up front")
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    finishes = [json.loads(ln[6:])["choices"][0]["finish_reason"] for ln in lines
                if ln.startswith("data: {") and json.loads(ln[6:]).get("choices")]
    assert "constraint_failed" in finishes and "stop" not in finishes, lines[-4:]
    errors = [json.loads(ln[6:])["error"] for ln in lines if ln.startswith("data: {") and '"error"' in ln]
    assert errors and errors[-1]["code"] == "constraint_failed", lines[-4:]
    assert lines[-1] == "data: [DONE]"
