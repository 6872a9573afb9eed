"""A dense model behind the server: chat, /metrics and /api/stats work, the stats say "dense"
(no expert counters pretend otherwise), and the page learns whether the model is a random demo."""
from __future__ import annotations

import httpx
import pytest

from freetoken.server.app import create_app
from freetoken.server.generation import GenerationService
from freetoken.server.server_state import ServerSettings
from live_server import LiveServer

KEY = "k"


@pytest.fixture(scope="module")
def dense_server(tiny_dir):
    from freetoken import LLM
    llm = LLM(str(tiny_dir("llama")), dtype="float32", max_model_len=1024, max_num_seqs=2, kv_cache_gib=0.02)
    svc = GenerationService(llm.engine, model_name="tiny-llama", architecture="LlamaForCausalLM",
                            max_running=2, max_waiting=4, max_tokens_cap=8)
    svc.loop.stats_every = 0.2
    srv = LiveServer(create_app(svc, ServerSettings(model_names=["tiny-llama"], api_key=KEY)))
    yield srv.url
    srv.stop()
    llm.close()


def test_dense_model_serves_and_says_dense(dense_server):
    auth = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(dense_server + "/v1/chat/completions", headers=auth, timeout=120, json={
        "model": "tiny-llama", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    st = httpx.get(dense_server + "/api/stats", headers=auth).json()
    assert st["engine"].get("dense") is True and "per_expert" not in st["engine"]
    assert st["random_demo"] is False
    assert httpx.get(dense_server + "/metrics", headers=auth).status_code == 200
    mem = httpx.get(dense_server + "/v1/memory", headers=auth)
    assert mem.status_code == 200
