"""/tokenize and /detokenize in the llama-server and vLLM shapes, against the checkpoint's
own tokenizer loaded independently (Hugging Face transformers)."""
import httpx
import pytest

MODEL = "capture-model"
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
TEXT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def hf_tok(tiny_model_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def post(url, path, body):
    return httpx.post(url + path, json=body, timeout=60)


def test_llama_server_shapes(tiny, hf_tok):
    _, url, _ = tiny
    r = post(url, "/tokenize", {"content": TEXT})
    assert r.status_code == 200
    ids = r.json()["tokens"]
    assert ids == hf_tok.encode(TEXT, add_special_tokens=False)
    pieces = post(url, "/tokenize", {"content": TEXT, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == ids
    assert "".join(p["piece"] for p in pieces) == hf_tok.decode(ids)
    back = post(url, "/detokenize", {"tokens": ids}).json()
    assert back == {"content": hf_tok.decode(ids)}


def test_vllm_prompt_shape(tiny, hf_tok, tiny_model_dir):
    llm, url, svc = tiny
    r = post(url, "/tokenize", {"model": MODEL, "prompt": TEXT}).json()
    assert r["tokens"] == hf_tok.encode(TEXT, add_special_tokens=True)
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] == svc.max_model_len
    assert post(url, "/detokenize", {"model": MODEL, "tokens": r["tokens"]}).json() == \
        {"prompt": hf_tok.decode(r["tokens"])}


def test_vllm_messages_shape_counts_what_a_chat_request_does(tiny, hf_tok):
    _, url, _ = tiny
    r = post(url, "/tokenize", {"model": MODEL, "messages": MESSAGES}).json()
    text = hf_tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert r["tokens"] == hf_tok.encode(text, add_special_tokens=False)
    chat = post(url, "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 1}).json()
    assert chat["usage"]["prompt_tokens"] == r["count"]
    plain = post(url, "/tokenize", {"model": MODEL, "messages": MESSAGES,
                                    "add_generation_prompt": False}).json()
    assert plain["count"] < r["count"]


@pytest.mark.parametrize("path,body,field", [
    ("/tokenize", {}, "content"),
    ("/tokenize", {"content": 5}, "content"),
    ("/tokenize", {"content": "x", "with_pieces": "yes"}, "with_pieces"),
    ("/tokenize", {"model": MODEL, "messages": "hi"}, "messages"),
    ("/tokenize", {"model": MODEL, "messages": [{"content": "no role"}]}, "messages[0]"),
    ("/tokenize", {"model": "no-such-model", "prompt": "x"}, "model"),
    ("/detokenize", {"tokens": "1 2 3"}, "tokens"),
    ("/detokenize", {"tokens": [1, -1]}, "tokens[1]"),
    ("/detokenize", {"tokens": [1, 10 ** 9]}, "tokens[1]"),
    ("/detokenize", {"tokens": [True]}, "tokens[0]"),
])
def test_bad_input_is_a_4xx_and_the_server_keeps_serving(tiny, path, body, field):
    _, url, _ = tiny
    r = post(url, path, body)
    assert 400 <= r.status_code < 500, r.text
    assert field in r.json()["error"]["message"]
    assert post(url, "/tokenize", {"content": "ok"}).status_code == 200


def test_not_json_is_refused(tiny):
    _, url, _ = tiny
    r = httpx.post(url + "/tokenize", content=b"[1, 2", headers={"content-type": "application/json"})
    assert r.status_code == 400
