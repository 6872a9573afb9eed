"""The smaller refusals of issue 25 (each was a 200 before): tool_choice that forces a tool
with no tools, a bad thinking.budget_tokens, a boolean where a number goes, a non-empty
logit_bias, a Responses grammar format; and a seed on /v1/messages reaching the sampler."""
import httpx
import pytest

USER = [{"role": "user", "content": "hi"}]
CHAT = {"model": "capture-model", "messages": USER, "max_tokens": 4}
MSG = {"model": "claude-x", "messages": USER, "max_tokens": 4}
RESP = {"model": "capture-model", "input": "hi", "max_output_tokens": 4}
COMPL = {"model": "capture-model", "prompt": "hi", "max_tokens": 4}

CASES = [
    ("/v1/chat/completions", {**CHAT, "tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ("/v1/messages", {**MSG, "tool_choice": {"type": "any"}}, "tool_choice"),
    ("/v1/responses", {**RESP, "tool_choice": "required"}, "tool_choice"),
    *[("/v1/messages", {**MSG, "thinking": {"type": "enabled", "budget_tokens": b}}, "thinking.budget_tokens")
      for b in (-1, 0, "x", True, 1.5)],
    *[(path, {**body, "temperature": True}, "temperature")
      for path, body in (("/v1/chat/completions", CHAT), ("/v1/messages", MSG), ("/v1/responses", RESP),
                         ("/v1/completions", COMPL))],
    ("/v1/chat/completions", {**CHAT, "max_tokens": True}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "seed": False}, "seed"),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"5": 10}}, "logit_bias"),
    ("/v1/messages", {**MSG, "logit_bias": {"5": 10}}, "logit_bias"),
    ("/v1/responses", {**RESP, "text": {"format": {"type": "grammar", "grammar": "start: \"a\""}}}, None),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "grammar"}}, "response_format"),
]


@pytest.mark.parametrize("path,body,param", CASES)
def test_refused_with_400_naming_the_field(fake, path, body, param):
    _, url, svc = fake
    r = httpx.post(url + path, json=body, timeout=30)
    assert r.status_code == 400, (path, body, r.status_code, r.text[:200])
    err = r.json().get("error") or {}
    assert err.get("message"), r.text
    if param is not None:
        assert param in (err.get("param") or "") + err["message"], err


@pytest.mark.parametrize("path,body", [("/v1/chat/completions", {**CHAT, "logit_bias": {}}),
                                       ("/v1/messages", {**MSG, "thinking": {"type": "enabled", "budget_tokens": 64}}),
                                       ("/v1/chat/completions", {**CHAT, "temperature": 0})])
def test_their_valid_neighbours_still_answer(fake, path, body):
    _, url, _ = fake
    assert httpx.post(url + path, json=body, timeout=30).status_code == 200


def test_seed_on_messages_reaches_the_sampler(fake):
    engine, url, _ = fake
    r = httpx.post(url + "/v1/messages", json={**MSG, "seed": 1234, "temperature": 1.0}, timeout=30)
    assert r.status_code == 200
    assert engine.added[-1][1].seed == 1234
