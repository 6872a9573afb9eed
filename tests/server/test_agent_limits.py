"""Context overflow and output caps as the real agents see them: their own captured
requests (tests/server/client_shapes, copied from ../shared/data/client-requests) replayed
against a server whose window or output cap they cross, and the replies checked with the
tests each client applies (transcribed from the pinned builds: Claude Code 2.1.332,
OpenCode 1.18.33, OpenClaw 2026.9.6). bench/agents_e2e.sh --long runs the clients live."""
from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from fake_engine import FakeEngine
from live_server import LiveServer, make_fake
from sse_check import check_anthropic_stream, check_chat_stream, parse_sse

from freetoken.cli.launch import plan, server_limits

SHAPES = Path(__file__).resolve().parent / "client_shapes"
DROP_HEADERS = {"host", "content-length", "connection", "transfer-encoding", "accept-encoding"}

# How each client recognises "the prompt overflowed the window" (then it compacts instead of
# retrying). Claude Code: /^prompt is too long: \d+ tokens > \d+ maximum$/ (and a substring
# test); OpenCode: error.code context_length_exceeded or one of its overflow patterns;
# OpenClaw: its "prompt is too long: N tokens > M maximum" pattern or "maximum context length".
ANTHROPIC_OVERFLOW = {
    "claude-code": lambda m: re.fullmatch(r"prompt is too long: \d+ tokens > \d+ maximum", m),
    "opencode": lambda m: re.search(r"prompt is too long", m, re.I),
    "openclaw": lambda m: re.search(r"prompt is too long:\s*([\d,]+)\s+tokens\s*>\s*[\d,]+\s+maximum",
                                    m, re.I),
}
OPENAI_OVERFLOW = {
    "opencode": lambda e: e.get("code") == "context_length_exceeded"
    or re.search(r"maximum context length is \d+ tokens", e["message"], re.I),
    "openclaw": lambda e: e.get("code") == "context_length_exceeded"
    and re.search(r"maximum context length\b", e["message"], re.I),
}
# stop reasons Claude Code accepts as the end of a turn (anything else is an API error)
CLAUDE_STOP_REASONS = {"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn",
                       "compaction", "refusal", "model_context_window_exceeded"}

CASES = sorted(p.relative_to(SHAPES).as_posix() for p in SHAPES.glob("*/*.json"))


def load(name: str):
    fx = json.loads((SHAPES / name).read_text())
    headers = {k: re.sub(r"<redacted len=\d+>", "dummy", v) for k, v in fx["headers"]
               if k.lower() not in DROP_HEADERS}
    return fx, headers


def send(url: str, name: str, **body_changes) -> httpx.Response:
    fx, headers = load(name)
    body = dict(fx["body"], **body_changes)
    return httpx.post(url + fx["path"], params=fx["query"], headers=headers, json=body, timeout=60)


def is_anthropic(name: str) -> bool:
    return json.loads((SHAPES / name).read_text())["path"].startswith("/v1/messages")


def client_of(name: str) -> str:
    return name.split("/")[0]


@pytest.fixture(scope="module")
def prompt_len():
    """Prompt tokens of each captured request on the scripted engine (one token per byte)."""
    _, _, app = make_fake()
    srv = LiveServer(app)
    out = {}
    try:
        for name in CASES:
            r = send(srv.url, name, stream=False)
            assert r.status_code == 200, r.text[:300]
            u = r.json()["usage"]
            out[name] = u.get("input_tokens", u.get("prompt_tokens"))
    finally:
        srv.stop()
    return out


def serve(**kw):
    engine = FakeEngine(max_model_len=kw.pop("max_model_len", 1 << 20))
    _, _, app = make_fake(engine, **kw)
    return LiveServer(app)


@pytest.mark.parametrize("name", CASES)
def test_overflow_in_the_clients_own_words(name, prompt_len):
    n = prompt_len[name]
    srv = serve(max_model_len=n - 10)
    try:
        r = send(srv.url, name)
    finally:
        srv.stop()
    assert r.status_code == 400, r.text[:300]
    body = r.json()
    if is_anthropic(name):
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        msg = body["error"]["message"]
        assert ANTHROPIC_OVERFLOW[client_of(name)](msg), msg
        got, limit = map(int, re.findall(r"\d+", msg))
        assert got == n and limit == n - 11          # the largest prompt the window takes
    else:
        err = body["error"]
        assert OPENAI_OVERFLOW[client_of(name)](err), err
        assert err["type"] == "invalid_request_error" and err["param"] == "messages"
        assert f"maximum context length is {n - 10} tokens" in err["message"]


@pytest.mark.parametrize("name", CASES)
def test_window_that_fills_up_mid_reply(name, prompt_len):
    """The prompt fits but the reply runs into the end of the window: Anthropic's own stop
    reason (not max_tokens, which Claude Code reports as 'exceeded the N output token
    maximum' with the N it asked for); OpenAI's finish_reason length."""
    n = prompt_len[name]
    srv = serve(max_model_len=n + 5)
    try:
        r = send(srv.url, name)
    finally:
        srv.stop()
    assert r.status_code == 200, r.text[:300]
    if is_anthropic(name):
        got = check_anthropic_stream(r.text)
        assert got["stop_reason"] == "model_context_window_exceeded"
        assert got["stop_reason"] in CLAUDE_STOP_REASONS
        usage = [d for _, d in parse_sse(r.text) if d["type"] == "message_delta"][0]["usage"]
        assert usage["output_tokens"] == 5
    else:
        got = check_chat_stream(r.text, include_usage=True)
        assert got["finish"] == "length"
        usage = [d for _, d in parse_sse(r.text) if d != "[DONE]" and d.get("usage")][-1]["usage"]
        assert usage["completion_tokens"] == 5


AGENT = {"claude-code": "claude", "opencode": "opencode", "openclaw": "openclaw"}


def configured_output(agent: str, env: dict, files: dict) -> int:
    """The max_tokens the agent sends under the configuration `launch` wrote."""
    if agent == "claude":
        return int(env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"])
    text = next(iter(files.values()))
    cfg = json.loads(text)
    if agent == "opencode":
        return next(iter(cfg["provider"]["freetoken"]["models"].values()))["limit"]["output"]
    return cfg["models"]["providers"]["freetoken"]["models"][0]["maxTokens"]


@pytest.mark.parametrize("name", CASES)
def test_output_cap_agrees_with_what_launch_configured(name, tmp_path):
    """A request above the server's cap is answered within it; /v1/models advertises the
    cap, `launch` configures the agent with it, so a reply cut at the cap is cut exactly at
    the agent's own max_tokens: what the agent then reports is true."""
    cap = 7
    srv = serve(max_tokens_cap=cap)
    try:
        models = httpx.get(srv.url + "/v1/models").json()["data"]
        assert {m["max_output_tokens"] for m in models} == {cap}
        r = send(srv.url, name)                     # as captured: 8192 to 128000 tokens
        assert r.status_code == 200
        limits = server_limits(srv.url, None, "capture-model")
        agent = AGENT[client_of(name)]
        env, files, _ = plan(agent, srv.url, limits, "k", tmp_path, [])
        asked = configured_output(agent, env, files)
        assert asked == cap
        field = "max_tokens" if is_anthropic(name) or "max_tokens" in load(name)[0]["body"] \
            else "max_completion_tokens"
        r2 = send(srv.url, name, **{field: asked})   # what the launched agent sends
    finally:
        srv.stop()
    for resp in (r, r2):
        if is_anthropic(name):
            got = check_anthropic_stream(resp.text)
            usage = [d for _, d in parse_sse(resp.text) if d["type"] == "message_delta"][0]["usage"]
            assert got["stop_reason"] == "max_tokens" and usage["output_tokens"] == cap
        else:
            got = check_chat_stream(resp.text, include_usage=True)
            usage = [d for _, d in parse_sse(resp.text) if d != "[DONE]" and d.get("usage")][-1]
            assert got["finish"] == "length" and usage["usage"]["completion_tokens"] == cap
