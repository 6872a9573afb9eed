"""Request logs never contain prompt text: with every logger at DEBUG, a secret sent in the
prompt of good, bad and streamed requests on every route appears in no log record (message,
arguments or traceback)."""
import logging
import traceback

import httpx
import pytest

SECRET = "zebra-secret-8731"


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.text = []

    def emit(self, record):
        if record.name.startswith(("httpx", "httpcore")):       # the test's own client
            return
        self.text.append(record.getMessage())
        if record.exc_info:
            self.text.append("".join(traceback.format_exception(*record.exc_info)))


@pytest.fixture
def logs():
    seen = Records()
    names = ("", "freetoken", "freetoken.server", "freetoken.engine", "uvicorn", "uvicorn.error",
             "uvicorn.access", "fastapi")
    saved = {}
    for n in names:
        lg = logging.getLogger(n)
        saved[n] = lg.level
        lg.setLevel(logging.DEBUG)
    # uvicorn's own loggers do not propagate to the root once a Config has configured them
    holders = [logging.getLogger(n) for n in ("", "uvicorn", "uvicorn.access")]
    for lg in holders:
        lg.addHandler(seen)
    yield seen
    for lg in holders:
        lg.removeHandler(seen)
    for n, level in saved.items():
        logging.getLogger(n).setLevel(level)


def _requests():
    user = [{"role": "user", "content": f"please keep {SECRET} to yourself"}]
    oa = {"model": "capture-model", "messages": user, "max_tokens": 5}
    an = {"model": "claude-x", "messages": user, "max_tokens": 5}
    return [
        ("/v1/chat/completions", oa), ("/v1/chat/completions", {**oa, "stream": True}),
        ("/v1/messages", an), ("/v1/messages", {**an, "stream": True}),
        ("/v1/responses", {"model": "capture-model", "input": user[0]["content"], "max_output_tokens": 5}),
        ("/v1/completions", {"model": "capture-model", "prompt": SECRET, "max_tokens": 5}),
        ("/v1/messages/count_tokens", {"model": "claude-x", "messages": user}),
        # refused ones: wrong types and values next to (or holding) the secret
        ("/v1/chat/completions", {**oa, "messages": [{"role": SECRET, "content": "x"}]}),
        ("/v1/chat/completions", {**oa, "messages": [{"role": "user", "content": [{"type": SECRET}]}]}),
        ("/v1/chat/completions", {**oa, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}],
                                  "stop": SECRET, "max_tokens": -1}),
        ("/v1/chat/completions", {**oa, "tool_choice": {"type": "function", "function": {"name": SECRET}}}),
        ("/v1/chat/completions", {**oa, "response_format": {"type": "json_schema", "json_schema": SECRET}}),
        ("/v1/messages", {**an, "messages": [{"role": "user", "content": [{"type": "text", "text": SECRET}]},
                                             {"role": SECRET, "content": 5}]}),
        ("/v1/messages", {**an, "system": [{"type": "text", "text": SECRET, "cache_control": 5}]}),
        ("/v1/responses", {"model": "capture-model", "input": [{"role": "user", "content": [{"type": SECRET}]}]}),
        ("/v1/completions", {"model": "capture-model", "prompt": [SECRET, 5]}),
        ("/v1/chat/completions", {**oa, "model": "nope"}),
    ]


def test_prompt_text_never_reaches_the_logs(fake, logs):
    _, url, _ = fake
    statuses = []
    for path, body in _requests():
        statuses.append(httpx.post(url + path, json=body, timeout=30).status_code)
    raw = httpx.post(url + "/v1/chat/completions", timeout=30, headers={"content-type": "application/json"},
                     content=b'{"model": "capture-model", "messages": [{"role": "user", "content": "' +
                     SECRET.encode() + b'\xff"}]}')
    statuses.append(raw.status_code)
    assert 200 in statuses and 400 in statuses, statuses
    assert all(s < 500 for s in statuses), statuses
    leaked = [t for t in logs.text if SECRET in t]
    assert not leaked, leaked[:3]
    assert logs.text, "nothing was logged at all: the capture is broken"


@pytest.fixture(scope="module")
def served_as_debug():
    """A server configured as `serve --log-level debug` configures it (access log on)."""
    import uvicorn

    from freetoken.server.operations.shutdown import uvicorn_config
    from live_server import LiveServer, make_fake
    engine, _, app = make_fake(api_key=SECRET + "-key")
    engine.default = f"generated {SECRET}-out text"
    srv = LiveServer(app, make_server=lambda kw: uvicorn.Server(
        uvicorn_config(app, 2, **dict(kw, log_level="debug", access_log=True))))
    yield srv
    srv.stop()


def test_no_query_string_key_or_generated_text_in_debug_logs(served_as_debug, logs):
    url, key = served_as_debug.url, SECRET + "-key"
    r = httpx.get(url + f"/v1/models?api_key={SECRET}-query", headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 200
    assert httpx.get(url + f"/v1/models?api_key={key}").status_code == 401       # wrong place for it
    for stream in (False, True):
        r = httpx.post(url + "/v1/chat/completions?x=" + SECRET, timeout=30, headers={"x-api-key": key},
                       json={"model": "capture-model", "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and ("[DONE]" if stream else SECRET + "-out") in r.text
    access = [t for t in logs.text if "/v1/models" in t]
    assert access, f"the access log was not captured: {logs.text[:5]}"
    leaked = [t for t in logs.text if SECRET in t]
    assert not leaked, leaked[:3]
