"""A server over the disk tier whose model file shrinks while it serves: the requests that
need the lost expert rows fail with a 500 in the API's error shape naming the file, /health
says degraded (why) but the engine runs, and once the file is whole again the same server answers as before."""
import os

import httpx
import pytest

from freetoken import LLM
from freetoken.server.app import create_app
from freetoken.server.generation import GenerationService
from freetoken.server.server_state import ServerSettings
from freetoken.weights.ftw.reader import read_header
from freetoken.loading.convert import convert

from live_server import MODEL_NAMES, LiveServer

BODY = {"model": MODEL_NAMES[0], "prompt": "one two three four", "max_tokens": 4, "temperature": 0}


def _serve(model_dir, tmp_path, slots: int):
    """(FTW file, LLM over it with the disk tier, live server over that LLM)."""
    ftw = tmp_path / "m.ftw"
    convert(model_dir, ftw, dtype="float32")
    llm = LLM(str(ftw), dtype="float32", host_cache_slots=slots, prefix_cache=False, max_model_len=512)
    svc = GenerationService(llm.engine, model_name=MODEL_NAMES[0], architecture="Qwen3MoeForCausalLM",
                            max_running=4, max_waiting=8, max_tokens_cap=8)
    return ftw, llm, LiveServer(create_app(svc, ServerSettings(model_names=MODEL_NAMES)))


@pytest.mark.timeout(300)
def test_shrunk_file_fails_requests_server_stays_up(tiny_model_dir, tmp_path):
    ftw, llm, srv = _serve(tiny_model_dir, tmp_path, slots=2)
    try:
        post = lambda: httpx.post(srv.url + "/v1/completions", json=BODY, timeout=120)   # noqa: E731
        first = post()
        assert first.status_code == 200, first.text
        last = max((t for t in read_header(ftw)["tensors"] if t["kind"] == "bank"), key=lambda t: t["offset"])
        data = ftw.read_bytes()
        os.truncate(ftw, last["offset"] + last["nbytes"] // 2)
        bad = post()
        assert bad.status_code == 500, bad.text
        assert "error" in bad.json() and "truncated" in bad.text and ftw.name in bad.text
        health = httpx.get(srv.url + "/health", timeout=30).json()
        assert health["status"] == "degraded" and "truncated" in health["error"]     # up, and says why
        ftw.write_bytes(data)
        again = post()
        assert again.status_code == 200 and again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
        assert httpx.get(srv.url + "/health", timeout=30).status_code == 200
    finally:
        srv.stop()
        llm.close()


@pytest.mark.timeout(300)
def test_memory_and_metrics_show_each_tier(tiny_model_dir, tmp_path):
    """GET /v1/memory and /metrics over the disk tier: the host cache's size and hit rate and
    the disk reads, as the engine counted them."""
    import time
    ftw, llm, srv = _serve(tiny_model_dir, tmp_path, slots=3)
    try:
        tiers = {}
        for _ in range(20):          # the engine thread snapshots its statistics about once a second
            assert httpx.post(srv.url + "/v1/completions", json=BODY, timeout=120).status_code == 200
            tiers = httpx.get(srv.url + "/v1/memory", timeout=30).json()["tiers"]
            if tiers.get("disk", {}).get("bytes_read"):
                break
            time.sleep(0.5)
        want = llm.expert_stats()
        assert tiers["backend"] == "disk" and "device_cache" not in tiers
        hc = tiers["host_cache"]
        assert hc["slots"] == 3 and 0 < hc["gib"] and 0 <= hc["hit_rate"] <= 1 and hc["misses"] > 0
        assert 0 < tiers["disk"]["bytes_read"] <= want["disk"]["bytes_read"] and tiers["disk"]["reads"] > 0
        assert tiers["lookahead"]["source"] in ("router", "history") and tiers["disk"]["io"]["mode"] in ("direct", "buffered")
        text = httpx.get(srv.url + "/metrics", timeout=30).text
        for name in ("freetoken_engine_host_cache_slots 3.0", "freetoken_engine_host_cache_hit_rate",
                     "freetoken_engine_disk_bytes_read", "freetoken_engine_disk_reads",
                     "freetoken_engine_lookahead_precision", "freetoken_engine_lookahead_wasted_per_useful"):
            assert name in text, name
    finally:
        srv.stop()
        llm.close()


@pytest.mark.timeout(300)
def test_file_rewritten_in_place_fails_those_requests_health_degraded_until_restored(tiny_model_dir, tmp_path):
    """Issue 36.1 at the server: plausible bytes written over an expert bank (another bank's)
    give the requests that need them a 500 naming the checksum, never other text; /health says
    the file changed; the original back, the same server answers as before and health is ok."""
    import time
    ftw, llm, srv = _serve(tiny_model_dir, tmp_path, slots=2)
    try:
        post = lambda: httpx.post(srv.url + "/v1/completions", json=BODY, timeout=120)   # noqa: E731
        first = post()
        assert first.status_code == 200, first.text
        banks = sorted((t for t in read_header(ftw)["tensors"] if t["kind"] == "bank"), key=lambda t: t["offset"])
        data = ftw.read_bytes()
        a, b = banks[0], banks[-1]
        n = min(a["nbytes"], b["nbytes"])
        with open(ftw, "r+b") as f:
            f.seek(a["offset"])
            f.write(data[b["offset"]:b["offset"] + n])
        bad = post()
        assert bad.status_code == 500, bad.text
        assert "does not match its checksum" in bad.text and ftw.name in bad.text
        health = httpx.get(srv.url + "/health", timeout=30)
        assert health.status_code == 503 and health.json()["status"] == "degraded"
        with open(ftw, "r+b") as f:
            f.write(data)
        again = post()
        assert again.status_code == 200 and again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
        for _ in range(100):            # the background re-verification of the restored file
            if httpx.get(srv.url + "/health", timeout=30).status_code == 200:
                break
            time.sleep(0.1)
        assert httpx.get(srv.url + "/health", timeout=30).json()["status"] == "ok"
    finally:
        srv.stop()
        llm.close()


@pytest.mark.timeout(300)
def test_disk_eio_fails_those_requests_server_stays_up(tiny_model_dir, tmp_path, monkeypatch):
    """The disk answers EIO to every expert read (direct or buffered alike): the requests that
    need a read get a 500 naming the file and the I/O error, the server stays up, and once the
    disk answers again the same server gives the same text."""
    import errno

    from freetoken.experts.disk import c_reads
    monkeypatch.setattr(c_reads, "ENABLED", False)     # the EIO is injected into the Python path's reads
    ftw, llm, srv = _serve(tiny_model_dir, tmp_path, slots=2)
    reader = llm.engine.model.experts.cache.reader
    real = reader._piece

    def eio(*a, **k):
        raise OSError(errno.EIO, "Input/output error")

    try:
        post = lambda: httpx.post(srv.url + "/v1/completions", json=BODY, timeout=120)   # noqa: E731
        first = post()
        assert first.status_code == 200, first.text
        llm.engine.model.experts.cache.drop_all()          # nothing cached: the next request must read
        reader._piece = eio
        bad = post()
        assert bad.status_code == 500, bad.text
        assert "error" in bad.json() and "Input/output error" in bad.text and ftw.name in bad.text
        assert httpx.get(srv.url + "/health", timeout=30).json()["status"] in ("ok", "degraded")
        reader._piece = real
        again = post()
        assert again.status_code == 200 and again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
    finally:
        reader._piece = real
        srv.stop()
        llm.close()
