"""POST/GET /admin/memory over the disk tier: GET shows the host cache, POST host_cache_gib
shrinks and grows it mid-stream without changing a token, a size under one expert is clamped
to one slot with the reason in the answer, bad sizes are 400s naming the field and change
nothing, and /metrics and /v1/memory show the new size."""
from __future__ import annotations

import threading
import time

import httpx
import pytest

from freetoken import LLM
from freetoken.server.app import create_app
from freetoken.server.generation import GenerationService
from freetoken.server.server_state import ServerSettings
from freetoken.loading.convert import convert

from live_server import MODEL_NAMES, LiveServer

TOKEN = "s3cret-admin"
GiB = 1 << 30
AUTH = {"x-admin-token": TOKEN}


@pytest.fixture(scope="module")
def disk(tiny_model_dir, tmp_path_factory):
    ftw = tmp_path_factory.mktemp("adminhc") / "m.ftw"
    convert(tiny_model_dir, ftw, dtype="float32")
    llm = LLM(str(ftw), dtype="float32", host_cache_slots=6, max_model_len=512, prefix_cache=False)
    svc = GenerationService(llm.engine, model_name=MODEL_NAMES[0], architecture="Qwen3MoeForCausalLM",
                            max_running=4, max_waiting=8)
    srv = LiveServer(create_app(svc, ServerSettings(model_names=MODEL_NAMES, admin_token=TOKEN)))
    yield llm, srv.url
    srv.stop()
    llm.close()


def sizes(url) -> dict:
    r = httpx.get(url + "/admin/memory", headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["sizes"]


def resize(url, **body) -> httpx.Response:
    return httpx.post(url + "/admin/memory", headers=AUTH, json=body, timeout=120)


@pytest.mark.timeout(300)
def test_host_cache_resizes_mid_stream_without_changing_a_token(disk):
    llm, url = disk
    hc = sizes(url)["host_cache"]
    assert hc["slots"] == 6 and hc["device"] == "host" and hc["bytes"] == 6 * hc["expert_bytes"]
    S = hc["expert_bytes"]
    body = {"model": MODEL_NAMES[0], "prompt": "count with me: one two three", "max_tokens": 120,
            "temperature": 0, "ignore_eos": True}
    ref = httpx.post(url + "/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]
    got = {}
    t = threading.Thread(target=lambda: got.update(httpx.post(url + "/v1/completions", json=body,
                                                              timeout=120).json()))
    t.start()
    for slots in (1, 6, 2, 6):
        r = resize(url, host_cache_gib=slots * S / GiB)
        assert r.status_code == 200, r.text
        assert r.json()["components"]["host_cache"]["slots_after"] == slots
        assert r.json()["sizes"]["host_cache"]["slots"] == slots
    t.join(120)
    assert got["choices"][0]["text"] == ref
    metrics = httpx.get(url + "/metrics", timeout=30).text
    assert 'freetoken_memory_resizes_total{component="host_cache",direction="shrink",trigger="api"} 2.0' in metrics
    gauge = next(x for x in metrics.splitlines() if x.startswith('freetoken_memory_bytes{component="host_cache"}'))
    assert float(gauge.split()[-1]) == 6 * S


@pytest.mark.timeout(300)
def test_a_size_under_one_expert_is_clamped_to_one_slot_and_shown(disk):
    llm, url = disk
    try:
        r = resize(url, host_cache_gib=0)
        assert r.status_code == 200, r.text
        hc = r.json()["components"]["host_cache"]
        assert hc["slots_after"] == 1 and "less than one expert" in hc["clamped"]
        assert httpx.get(url + "/v1/memory", timeout=30).json()["current"]["host_cache"]["slots"] == 1
        tiers = {}
        for _ in range(20):       # the engine thread snapshots its statistics about once a second
            httpx.post(url + "/v1/completions", json={"model": MODEL_NAMES[0], "prompt": "hi", "max_tokens": 2},
                       timeout=120)
            tiers = httpx.get(url + "/v1/memory", timeout=30).json()["tiers"]
            if tiers.get("host_cache", {}).get("slots") == 1:
                break
            time.sleep(0.5)
        assert tiers["host_cache"]["slots"] == 1
    finally:
        resize(url, host_cache_gib=6 * sizes(url)["host_cache"]["expert_bytes"] / GiB)


@pytest.mark.parametrize("raw", [b'{"host_cache_gib": -1}', b'{"host_cache_gib": "2"}', b'{"host_cache_gib": NaN}',
                                 b'{"host_cache_gib": 1e6}', b'{"host_cache_gib": 1e308}',
                                 b'{"kv_cache_gib": 0.001, "host_cache_gib": true}'])
def test_bad_host_cache_sizes_are_400_and_change_nothing(disk, raw):
    _, url = disk
    before = sizes(url)
    r = httpx.post(url + "/admin/memory", content=raw, headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 400, (raw, r.status_code, r.text[:200])
    assert "host_cache_gib" in r.json()["error"]["message"], r.text
    after = sizes(url)
    assert {k: v and v["bytes"] for k, v in after.items()} == {k: v and v["bytes"] for k, v in before.items()}
