"""`ignore_eos` (vLLM/SGLang) on chat and text completions: a model made to stop early (its
greedy continuation's third token declared EOS) stops there without it, and with it runs
on to exactly max_tokens."""
import httpx
import pytest

from freetoken import SamplingParams
from freetoken.server.app import create_app
from freetoken.server.chat import render
from freetoken.server.generation import GenerationService
from freetoken.server.server_state import ServerSettings

from live_server import MODEL_NAMES, LiveServer

MAX = 12
MESSAGES = [{"role": "user", "content": "tell me a story"}]


@pytest.fixture(scope="module")
def early_stopper(tiny_model_dir):
    from freetoken import LLM
    llm = LLM(str(tiny_model_dir), dtype="float32", max_model_len=4096, max_num_seqs=2,
              kv_cache_gib=0.05)
    tok = llm.engine.tokenizer
    ids = tok.encode(render(tok, MESSAGES, None, {}))
    greedy = llm.generate([ids], SamplingParams(max_tokens=MAX, temperature=0.0,
                                                ignore_eos=True))[0].token_ids
    # the first token (after the first) not seen before: declared EOS, generation stops there
    k = next(i for i in range(2, MAX) if greedy[i] not in greedy[:i])
    saved = set(tok.eos_token_ids)
    tok.eos_token_ids.add(greedy[k])
    svc = GenerationService(llm.engine, model_name=MODEL_NAMES[0],
                            architecture="Qwen3MoeForCausalLM", max_running=2, max_waiting=4)
    srv = LiveServer(create_app(svc, ServerSettings(model_names=MODEL_NAMES)))
    yield srv.url, ids, k
    srv.stop()
    tok.eos_token_ids.clear()
    tok.eos_token_ids.update(saved)
    llm.close()


def _chat(url, **extra):
    r = httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "model": MODEL_NAMES[0], "messages": MESSAGES, "max_tokens": MAX, "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_chat_stops_at_eos_without_it(early_stopper):
    url, _, k = early_stopper
    r = _chat(url)
    assert r["choices"][0]["finish_reason"] == "stop"
    assert r["usage"]["completion_tokens"] == k + 1 < MAX      # the EOS token counts


def test_chat_ignore_eos_generates_max_tokens(early_stopper):
    url, _, _ = early_stopper
    r = _chat(url, ignore_eos=True)
    assert r["choices"][0]["finish_reason"] == "length"
    assert r["usage"]["completion_tokens"] == MAX


def test_chat_ignore_eos_streamed(early_stopper):
    url, _, _ = early_stopper
    import json
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=120, json={
            "model": MODEL_NAMES[0], "messages": MESSAGES, "max_tokens": MAX, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    assert chunks[-1]["usage"]["completion_tokens"] == MAX
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"


def test_completions_ignore_eos(early_stopper):
    url, ids, k = early_stopper
    body = {"model": MODEL_NAMES[0], "prompt": ids, "max_tokens": MAX, "temperature": 0}
    plain = httpx.post(url + "/v1/completions", json=body, timeout=120).json()
    assert plain["usage"]["completion_tokens"] == k + 1
    full = httpx.post(url + "/v1/completions", json={**body, "ignore_eos": True}, timeout=120).json()
    assert full["usage"]["completion_tokens"] == MAX
    assert full["choices"][0]["finish_reason"] == "length"


def test_ignore_eos_must_be_a_boolean(early_stopper):
    url, _, _ = early_stopper
    r = httpx.post(url + "/v1/chat/completions", timeout=30, json={
        "model": MODEL_NAMES[0], "messages": MESSAGES, "ignore_eos": "yes"})
    assert r.status_code == 400 and "ignore_eos" in r.json()["error"]["message"]
