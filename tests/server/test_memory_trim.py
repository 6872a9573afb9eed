"""The C heap is trimmed once after a request with a large body (refused or not), never
after small ones; trim() runs on glibc and is a no-op elsewhere."""
import json
import sys

import pytest
from fastapi.testclient import TestClient

from freetoken.server.operations import memory_trim

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from live_server import make_fake  # noqa: E402


@pytest.fixture
def counted(monkeypatch):
    calls = []
    monkeypatch.setattr(memory_trim, "trim", lambda: calls.append(1) or True)
    _, _, app = make_fake(max_body_bytes=4 << 20)
    with TestClient(app, base_url="http://localhost") as c:
        yield c, calls


def _chat(text: str) -> bytes:
    return json.dumps({"model": "capture-model", "max_tokens": 2,
                       "messages": [{"role": "user", "content": text}]}).encode()


def test_small_bodies_are_not_trimmed(counted):
    c, calls = counted
    assert c.post("/v1/chat/completions", content=_chat("hi"),
                  headers={"content-type": "application/json"}).status_code == 200
    assert calls == []


def test_a_large_body_is_trimmed_after_its_reply(counted):
    c, calls = counted
    r = c.post("/v1/chat/completions", content=_chat("x" * (2 << 20)), headers={"content-type": "application/json"})
    assert r.status_code < 500, r.text[:200]
    assert calls == [1]
    # refused on its Content-Length alone: nothing was read, nothing to trim
    assert c.post("/v1/chat/completions", content=_chat("x" * (5 << 20)),
                  headers={"content-type": "application/json"}).status_code == 413
    assert calls == [1]


def test_trim_runs_here():
    import platform
    assert memory_trim.trim() is (platform.libc_ver()[0] == "glibc")
