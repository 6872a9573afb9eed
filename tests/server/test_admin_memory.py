"""POST/GET /admin/memory over a real tiny model: off by default, token-protected, errors in
the server's shape, a resize mid-stream leaves the stream's tokens as they were, and every
resize is a Prometheus count plus new size gauges."""
from __future__ import annotations

import threading

import httpx
import pytest

from freetoken import LLM
from freetoken.server.app import create_app
from freetoken.server.generation import GenerationService
from freetoken.server.server_state import ServerSettings

from live_server import MODEL_NAMES, LiveServer

TOKEN = "s3cret-admin"
GiB = 1 << 30


@pytest.fixture(scope="module")
def admin(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), dtype="float32", max_model_len=512, max_num_seqs=4, kv_cache_gib=0.01,
              moe_backend="offload", expert_cache_slots=8, kv_block_size=8)
    svc = GenerationService(llm.engine, model_name=MODEL_NAMES[0], architecture="Qwen3MoeForCausalLM",
                            max_running=4, max_waiting=8)
    srv = LiveServer(create_app(svc, ServerSettings(model_names=MODEL_NAMES, api_key="user-key", admin_token=TOKEN)))
    yield llm, srv.url, svc
    srv.stop()
    llm.close()


def auth(tok=TOKEN):
    return {"x-admin-token": tok}


def test_admin_routes_are_off_without_a_token(fake):
    _, url, _ = fake
    r = httpx.post(url + "/admin/memory", json={"kv_cache_gib": 1})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_wrong_or_missing_token_is_401_in_the_error_shape(admin):
    _, url, _ = admin
    for headers in ({}, auth("nope"), {"authorization": "Bearer user-key"}):
        r = httpx.get(url + "/admin/memory", headers=headers)
        assert r.status_code == 401, headers
        assert r.json()["error"]["type"] == "authentication_error" and "admin token" in r.json()["error"]["message"]


@pytest.mark.parametrize("body,needle", [({"kv_cache_gib": -1}, "kv_cache_gib"), ({"kv": 1}, "unknown field"),
                                         ({}, "nothing to resize"), ([1], "JSON object"),
                                         ({"kv_cache_gib": 1, "allow_preempt": "yes"}, "allow_preempt")])
def test_bad_bodies_are_400_naming_the_field(admin, body, needle):
    _, url, _ = admin
    r = httpx.post(url + "/admin/memory", json=body, headers=auth())
    assert r.status_code == 400 and needle in r.json()["error"]["message"]


def test_get_reports_sizes_and_a_resize_mid_stream_changes_no_token(admin):
    llm, url, svc = admin
    sizes = httpx.get(url + "/admin/memory", headers={"authorization": f"Bearer {TOKEN}"}).json()["sizes"]
    kv, ex = sizes["kv_cache"]["bytes"], sizes["expert_cache"]["bytes"]
    body = {"model": MODEL_NAMES[0], "prompt": "count with me: one two three", "max_tokens": 160,
            "temperature": 0, "ignore_eos": True}
    headers = {"authorization": "Bearer user-key"}
    ref = httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=120).json()["choices"][0]["text"]

    got = {}
    t = threading.Thread(target=lambda: got.update(httpx.post(url + "/v1/completions", json=body, headers=headers,
                                                              timeout=120).json()))
    t.start()
    for i in range(6):
        scale = 0.5 if i % 2 == 0 else 1.0
        r = httpx.post(url + "/admin/memory", headers=auth(), timeout=120,
                       json={"kv_cache_gib": kv * scale / GiB, "expert_cache_gib": ex * scale / GiB})
        assert r.status_code == 200, r.text
    t.join(120)
    assert got["choices"][0]["text"] == ref
    after = httpx.get(url + "/admin/memory", headers=auth()).json()["sizes"]
    assert after["expert_cache"]["bytes"] == ex and after["kv_cache"]["bytes"] == kv

    metrics = httpx.get(url + "/metrics", headers=headers).text
    assert 'freetoken_memory_resizes_total{component="expert_cache",direction="shrink",trigger="api"} 3.0' in metrics
    gauge = next(line for line in metrics.splitlines() if line.startswith('freetoken_memory_bytes{component="kv_cache"}'))
    assert float(gauge.split()[-1]) == kv


def test_the_engine_thread_runs_the_watcher_and_counts_its_resizes(admin):
    import argparse
    import time

    from freetoken.memory.watcher import MemoryWatcher
    from freetoken.server.build import memory_watcher
    llm, url, svc = admin
    args = argparse.Namespace(memory_floor_gib=1.0, memory_ceiling_gib=None, memory_watch_interval=0.0)
    w = memory_watcher(args, llm.engine)
    assert isinstance(w, MemoryWatcher) and w.policy.ceiling_bytes == int(1.75 * GiB)
    free = {"host": 0}
    w.read_free = lambda: dict(free)                    # another program took everything
    w.policy = type(w.policy)(w.policy.floor_bytes, w.policy.ceiling_bytes, 0.0, 0.0)
    svc.loop.watcher = w
    try:
        deadline = time.monotonic() + 30
        while llm.engine.memory_sizes()["expert_cache"]["slots"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert llm.engine.memory_sizes()["expert_cache"]["slots"] == 0
        free["host"] = 64 * GiB                           # it is gone again: grow back to the plan
        while llm.engine.memory_sizes()["expert_cache"]["slots"] != 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert llm.engine.memory_sizes()["expert_cache"]["slots"] == 8
    finally:
        svc.loop.watcher = None
    metrics = httpx.get(url + "/metrics", headers={"authorization": "Bearer user-key"}).text
    assert 'freetoken_memory_resizes_total{component="expert_cache",direction="shrink",trigger="watcher"}' in metrics
    assert 'freetoken_memory_free_bytes{device="host"}' in metrics
    assert "freetoken_memory_pinned_bytes 0.0" in metrics                  # CPU: nothing page-locked


def test_v1_memory_shows_the_current_sizes_beside_the_plan(admin):
    """After a runtime resize, GET /v1/memory keeps the start-up plan and adds the sizes now."""
    llm, url, _ = admin
    headers = {"authorization": "Bearer user-key"}
    before = httpx.get(url + "/v1/memory", headers=headers).json()
    kv, ex = before["current"]["kv_cache"]["bytes"], before["current"]["expert_cache"]["bytes"]
    plan_kv = next(i for i in before["items"] if i["name"] == "KV cache")["nbytes"]
    assert kv == plan_kv == llm.engine.runner.kv_nbytes
    assert before["pinned_bytes"] == before["pinned_bytes_now"] == 0        # CPU: nothing page-locked
    try:
        r = httpx.post(url + "/admin/memory", headers=auth(), timeout=120,
                       json={"kv_cache_gib": kv / 2 / GiB, "expert_cache_gib": ex / 2 / GiB})
        assert r.status_code == 200, r.text
        after = httpx.get(url + "/v1/memory", headers=headers).json()
        assert after["current"] == llm.engine.memory_sizes()
        assert after["current"]["kv_cache"]["bytes"] < kv and after["current"]["expert_cache"]["bytes"] < ex
        assert after["items"] == before["items"]                 # the plan is what start-up decided
    finally:
        httpx.post(url + "/admin/memory", headers=auth(), timeout=120,
                   json={"kv_cache_gib": kv / GiB, "expert_cache_gib": ex / GiB})


@pytest.mark.parametrize("raw", [b'{"kv_cache_gib": 1e308}', b'{"expert_cache_gib": 1e308}',
                                 b'{"state_cache_gib": 1e12}', b'{"state_cache_gib": 1e6}',
                                 b'{"kv_cache_gib": NaN}', b'{"kv_cache_gib": Infinity}',
                                 b'{"kv_cache_gib": -1e-9}', b'{"state_cache_gib": "1"}',
                                 b'{"kv_cache_gib": 1, "state_cache_gib": 1e12}',
                                 b'{"kv_cache_gib": ' + b"9" * 400 + b'}', b'{"kv_cache_gib": true}'])
def test_absurd_sizes_are_400_and_change_nothing(admin, raw):
    """Huge, negative, NaN and non-numeric sizes: a 4xx naming the field, no allocation tried,
    every size as it was (a bad field next to a good one changes neither)."""
    _, url, _ = admin
    before = httpx.get(url + "/admin/memory", headers=auth()).json()["sizes"]
    r = httpx.post(url + "/admin/memory", content=raw, headers={**auth(), "content-type": "application/json"})
    assert r.status_code == 400, (raw, r.status_code, r.text[:200])
    assert "_cache_gib" in r.json()["error"]["message"] or "number" in r.json()["error"]["message"], r.text
    after = httpx.get(url + "/admin/memory", headers=auth()).json()["sizes"]
    assert {k: v and v["bytes"] for k, v in after.items()} == {k: v and v["bytes"] for k, v in before.items()}


def test_a_curl_form_content_type_is_read_as_json(admin):
    """docs/memory.md's `curl -d '{...}'` sends application/x-www-form-urlencoded (issue 36:
    415): admin routes read the body as JSON whatever its type, since their token header
    already rules out a cross-site form post; a form post without the token is still 401."""
    _, url, _ = admin
    form = {"content-type": "application/x-www-form-urlencoded"}
    r = httpx.post(url + "/admin/memory", content=b'{"kv_cache_gib": 0.01}', headers={**auth(), **form})
    assert r.status_code == 200, r.text
    r = httpx.post(url + "/admin/memory", content=b'{"kv_cache_gib": 0.01}', headers=form)
    assert r.status_code == 401
    r = httpx.post(url + "/admin/memory", content=b"kv_cache_gib=1", headers={**auth(), **form})
    assert r.status_code == 400, r.text          # not JSON: a 400 saying so, not a form parse
    # the JSON-only rule still holds for the API routes
    r = httpx.post(url + "/v1/chat/completions", content=b"{}", headers=form)
    assert r.status_code == 415
