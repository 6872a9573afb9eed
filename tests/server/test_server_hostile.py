"""Every hand-written hostile request gets a protocol-shaped 4xx (never a 500 or a
traceback), bodies over the limit get 413 before they are read whole, and the server
keeps serving after all of them."""
import httpx
import pytest
from hostile_cases import AN, CASES, OA, encoded
from live_server import MODEL_NAMES, LiveServer

from freetoken.server.app import create_app
from freetoken.server.server_state import ServerSettings

HDR = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def server(tiny):
    """The tiny model (a real tokenizer, template and grammar compiler) behind a second app
    with a 1 MiB body limit."""
    svc = tiny[2]
    app = create_app(svc, ServerSettings(model_names=MODEL_NAMES, max_body_bytes=1 << 20),
                     manage_engine=False)
    srv = LiveServer(app)
    yield srv.url, svc
    srv.stop()


def check_shape(r, path):
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:500])
    body = r.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["message"], body
    else:
        assert body["error"]["message"] and body["error"]["type"], body


@pytest.mark.parametrize("name,path,body", CASES, ids=[c[0] for c in CASES])
def test_hostile_case_is_a_4xx(server, name, path, body):
    url, svc = server
    r = httpx.post(url + path, content=encoded(body), headers=HDR, timeout=60)
    if r.status_code == 200:     # some cases are legal (an unusual but valid request)
        assert name in LEGAL, r.text[:300]
        return
    check_shape(r, path)


LEGAL = {"template-escape", "template-escape-2", "tool-call-id-dict", "content-part-text-dict",
         "anthropic-tool_use-input-str", "responses-reasoning-content-str", "responses-text-format-str",
         "responses-reasoning-str"}


@pytest.mark.parametrize("path", [OA, AN])
def test_oversized_body_is_413(server, path):
    url, _ = server
    big = b'{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "' + b"a" * (2 << 20) + b'"}]}'
    r = httpx.post(url + path, content=big, headers=HDR, timeout=60)
    assert r.status_code == 413, r.text[:300]
    check_shape(r, path)

    def chunks():          # no Content-Length: the limit must hold while streaming the body
        for _ in range(64):
            yield b"a" * (64 << 10)
    r = httpx.post(url + path, content=chunks(), headers=HDR, timeout=60)
    assert r.status_code == 413, r.text[:300]


def test_server_keeps_serving(server):
    url, svc = server
    r = httpx.post(url + OA, json={"model": "capture-model", "max_tokens": 4,
                                   "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    assert r.status_code == 200, r.text
    assert b'status="500"' not in httpx.get(url + "/metrics").content
