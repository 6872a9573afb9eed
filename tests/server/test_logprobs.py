"""logprobs on /v1/completions (with echo) and chat (logprobs/top_logprobs) against a real
tiny model: every number equals the log-softmax of what `LLM.score` gives for the same
tokens (an engine of its own over the same checkpoint), the shapes are OpenAI's, and asks
past the bound are a 400 naming the field (issue 36)."""
from __future__ import annotations

import json

import httpx
import pytest
import torch

from freetoken.sampling_params import MAX_TOP_LOGPROBS

PROMPT_IDS = [5, 17, 3, 99, 42, 7, 250, 11, 64, 8, 300, 12]
TOL = 2e-3          # batched decode vs one prefill of the whole sequence, float32


@pytest.fixture(scope="module")
def scorer(tiny_model_dir):
    from freetoken import LLM
    llm = LLM(str(tiny_model_dir), dtype="float32", max_model_len=4096, kv_cache_gib=0.05)
    yield lambda ids: torch.log_softmax(llm.score(ids).double(), dim=-1)
    llm.close()


def post(url, path, body, status=200):
    r = httpx.post(url + path, json={"model": "capture-model", **body}, timeout=120)
    assert r.status_code == status, r.text
    return r.json()


def test_completion_echo_logprobs_equal_the_scores(tiny, scorer):
    """What lm-evaluation-harness's local-completions sends for a loglikelihood request:
    token ids as a batch of one, echo, logprobs 1, max_tokens 1, temperature 0."""
    _, url, _ = tiny
    out = post(url, "/v1/completions", {"prompt": [PROMPT_IDS], "echo": True, "logprobs": 5,
                                        "max_tokens": 1, "temperature": 0})
    lp = out["choices"][0]["logprobs"]
    n = len(PROMPT_IDS)
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n + 1
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    ref = scorer(PROMPT_IDS)
    want = [float(ref[j, PROMPT_IDS[j + 1]]) for j in range(n - 1)]
    assert lp["token_logprobs"][1:n] == pytest.approx(want, abs=TOL)
    # the generated token: greedy, so the most likely under the last prompt row
    g = int(torch.argmax(ref[n - 1]))
    assert lp["token_logprobs"][n] == pytest.approx(float(ref[n - 1, g]), abs=TOL)
    assert lp["token_logprobs"][n] == pytest.approx(max(lp["top_logprobs"][n].values()), abs=1e-6)
    for j in range(1, n + 1):      # k alternatives plus the token itself, as OpenAI documents
        top = lp["top_logprobs"][j]
        assert 5 <= len(top) <= 6 and lp["token_logprobs"][j] in top.values()
        best5 = sorted(ref[j - 1].tolist(), reverse=True)[:5]
        assert sorted(top.values(), reverse=True)[:5] == pytest.approx(best5, abs=TOL)
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0


def test_generated_logprobs_equal_the_scores_of_the_whole_sequence(tiny, scorer):
    _, url, _ = tiny
    out = post(url, "/v1/completions", {"prompt": PROMPT_IDS, "logprobs": 2, "max_tokens": 6,
                                        "temperature": 1.0, "seed": 7})
    lp = out["choices"][0]["logprobs"]
    assert lp["token_logprobs"][0] is not None       # no echo: the generated tokens only
    # the generated ids, from the tokens' text offsets: ask the server to tokenize? No: the
    # scorer scores every candidate and the reported number must be one of the row's
    # values; with the top-2 plus the chosen token we can match the id exactly
    gen_ids = []
    for j, top in enumerate(lp["top_logprobs"]):
        row = scorer(PROMPT_IDS + gen_ids)[len(PROMPT_IDS) + j - 1]
        tid = int(torch.argmin((row - lp["token_logprobs"][j]).abs()))
        assert float(row[tid]) == pytest.approx(lp["token_logprobs"][j], abs=TOL)
        gen_ids.append(tid)
    assert len(gen_ids) == out["usage"]["completion_tokens"]
    assert lp["text_offset"][0] > 0         # offsets into prompt + completion, as OpenAI's


def test_prompt_only_with_max_tokens_0(tiny, scorer):
    _, url, _ = tiny
    out = post(url, "/v1/completions", {"prompt": PROMPT_IDS, "echo": True, "logprobs": 0, "max_tokens": 0})
    lp = out["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(PROMPT_IDS) and out["usage"]["completion_tokens"] == 0
    ref = scorer(PROMPT_IDS)
    assert lp["token_logprobs"][-1] == pytest.approx(float(ref[-2, PROMPT_IDS[-1]]), abs=TOL)
    assert all(len(t) == 1 for t in lp["top_logprobs"][1:])      # logprobs 0: the token alone


def test_streamed_completion_logprobs_match_the_whole_answer(tiny):
    _, url, _ = tiny
    body = {"model": "capture-model", "prompt": PROMPT_IDS, "logprobs": 1, "max_tokens": 6, "temperature": 0}
    whole = post(url, "/v1/completions", body)["choices"][0]["logprobs"]["token_logprobs"]
    got = []
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=120) as r:
        for ln in r.iter_lines():
            if ln.startswith("data: {"):
                ch = json.loads(ln[6:])["choices"]
                if ch and ch[0]["logprobs"]:
                    got += ch[0]["logprobs"]["token_logprobs"]
    assert got == pytest.approx(whole, abs=1e-5)


def test_chat_logprobs_and_top_logprobs(tiny):
    _, url, _ = tiny
    out = post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                                             "top_logprobs": 3, "max_tokens": 5, "temperature": 0})
    ch = out["choices"][0]
    content = ch["logprobs"]["content"]
    assert len(content) == out["usage"]["completion_tokens"]
    for e in content:
        assert set(e) == {"token", "logprob", "bytes", "top_logprobs"} and len(e["top_logprobs"]) == 3
        tops = [t["logprob"] for t in e["top_logprobs"]]
        assert tops == sorted(tops, reverse=True)
        assert e["top_logprobs"][0]["token"] == e["token"] and e["logprob"] == tops[0]    # greedy
        assert e["logprob"] <= 0 and all(0 <= b < 256 for b in e["bytes"])
    # logprobs without top_logprobs: the tokens alone
    out = post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                                             "max_tokens": 2})
    assert all(e["top_logprobs"] == [] for e in out["choices"][0]["logprobs"]["content"])
    out = post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert out["choices"][0]["logprobs"] is None


def test_chat_stream_carries_logprobs(tiny):
    _, url, _ = tiny
    n = 0
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=120, json={
            "model": "capture-model", "stream": True, "logprobs": True, "top_logprobs": 2, "max_tokens": 4,
            "stream_options": {"include_usage": True}, "messages": [{"role": "user", "content": "hi"}]}) as r:
        usage = None
        for ln in r.iter_lines():
            if ln.startswith("data: {"):
                d = json.loads(ln[6:])
                if d["choices"] and d["choices"][0]["logprobs"]:
                    n += len(d["choices"][0]["logprobs"]["content"])
                usage = d.get("usage") or usage
    assert n == usage["completion_tokens"]


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": "hi", "logprobs": MAX_TOP_LOGPROBS + 1}, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 3000}, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "logprobs": -1}, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 1, "echo": True, "stream": True}, "echo"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True,
                              "top_logprobs": MAX_TOP_LOGPROBS + 1}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
])
def test_past_the_bound_is_a_400_naming_the_field(tiny, path, body, param):
    out = post(tiny[1], path, body, status=400)
    assert out["error"]["param"] == param, out
    assert "[0, 20]" in out["error"]["message"] or param in out["error"]["message"]


def test_echo_logprobs_past_the_memory_bound_is_a_400(tiny, monkeypatch):
    from freetoken.server.api import logprobs as logprobs_api
    monkeypatch.setattr(logprobs_api, "MAX_ECHO_LOGITS_BYTES", 4 * tiny[2].engine.vocab_size * 5)
    out = post(tiny[1], "/v1/completions", {"prompt": PROMPT_IDS, "echo": True, "logprobs": 1, "max_tokens": 1},
               status=400)
    assert out["error"]["param"] == "echo" and "at most 5 prompt tokens" in out["error"]["message"]
    post(tiny[1], "/v1/completions", {"prompt": PROMPT_IDS[:5], "echo": True, "logprobs": 1, "max_tokens": 1})
