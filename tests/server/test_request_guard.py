"""Issue 25.4: a web page cannot drive the default server: a DNS name other than loopback in
Host (rebinding), a foreign Origin, and a body that is not declared JSON are refused before
any route; CORS answers only for --cors-origins."""
import httpx
import pytest

from freetoken.server.guards.request_guard import host_name

from live_server import LiveServer, make_fake

CHAT = {"model": "capture-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_host_names():
    assert host_name("LocalHost:8000") == "localhost"
    assert host_name("[::1]:8000") == "::1"
    assert host_name("::1") == "::1"
    assert host_name("evil.example.") == "evil.example"


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.nip.io", ""])
def test_rebinding_host_refused(fake, host):
    _, url, _ = fake
    for path in ("/v1/models", "/metrics", "/v1/memory"):
        r = httpx.get(url + path, headers={"host": host})
        assert r.status_code == 403 and "allowed-hosts" in r.json()["error"]["message"], (path, r.text)
    r = httpx.post(url + "/v1/messages", json=CHAT, headers={"host": host})
    assert r.status_code == 403 and r.json()["type"] == "error"
    assert httpx.get(url + "/health", headers={"host": host}).status_code == 200   # probes


@pytest.mark.parametrize("host", ["localhost", "localhost:1234", "127.0.0.1", "[::1]:80", "10.1.2.3"])
def test_loopback_and_ip_hosts_served(fake, host):
    _, url, _ = fake
    assert httpx.get(url + "/v1/models", headers={"host": host}).status_code == 200


@pytest.mark.parametrize("ctype", [None, "text/plain", "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=x"])
def test_post_needs_json_content_type(fake, ctype):
    _, url, _ = fake
    import json
    headers = {"content-type": ctype} if ctype else {}
    for path in ("/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/completions"):
        r = httpx.post(url + path, content=json.dumps(CHAT), headers=headers)
        assert r.status_code == 415, (path, r.status_code, r.text)


def test_foreign_origin_refused(fake):
    _, url, _ = fake
    for origin in ("https://evil.example", "null", "http://localhost:3000"):
        r = httpx.post(url + "/v1/chat/completions", json=CHAT, headers={"origin": origin})
        assert r.status_code == 403, (origin, r.text)
        assert "access-control-allow-origin" not in r.headers
    assert httpx.post(url + "/v1/chat/completions", json=CHAT, headers={"origin": url}).status_code == 200


def test_allowed_hosts_and_cors_origins():
    _, _, app = make_fake()
    s = app.state.freetoken.settings
    assert s.allowed_hosts == [] and s.cors_origins == []
    from freetoken.server.app import create_app
    from freetoken.server.server_state import ServerSettings
    svc = app.state.freetoken.svc
    app2 = create_app(svc, ServerSettings(model_names=s.model_names, allowed_hosts=["box.lan"],
                                    cors_origins=["https://ui.example"]), manage_engine=False)
    srv = LiveServer(app2)
    try:
        url = srv.url
        assert httpx.get(url + "/v1/models", headers={"host": "box.lan:8000"}).status_code == 200
        assert httpx.get(url + "/v1/models", headers={"host": "other.lan"}).status_code == 403
        pre = httpx.options(url + "/v1/chat/completions", headers={
            "origin": "https://ui.example", "access-control-request-method": "POST",
            "access-control-request-headers": "content-type"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "https://ui.example"
        r = httpx.get(url + "/v1/models", headers={"origin": "https://ui.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://ui.example"
        assert httpx.get(url + "/v1/models", headers={"origin": "https://evil.example"}).status_code == 403
    finally:
        srv.stop()
