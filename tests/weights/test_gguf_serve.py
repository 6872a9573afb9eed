"""A single .gguf file is a complete model: tokenizer and chat template from its metadata
agree with the checkpoint's own, and `serve --model` runs it (a path, or an Ollama name
resolved to the same file as a blob); deepseek2 and glm4moe files answer a chat through
the real chat template they carry."""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil

import pytest
from fastapi.testclient import TestClient
from gguf_rewrite import rewrite
from helpers import SHARED_DATA

from freetoken import LLM
from freetoken.sampling_params import SamplingParams
from freetoken.tokenizer import Tokenizer
from freetoken.weights.gguf.reader import GgufFile

TEXTS = ["Hello world", "def add(a, b):\n    return a + b\n", "  spaces\tand\nnewlines  ",
         "<|im_start|>user\nhi<|im_end|>", "naïve café 東京 🙂", '{"name": "get_weather"}']


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral", "gpt_oss"])
def test_tokenizer_and_template_match_the_checkpoint(tiny_dir, to_gguf, arch):
    d = tiny_dir(arch)
    ours, theirs = Tokenizer(to_gguf(d, "q8_0")), Tokenizer(d)
    for text in TEXTS:
        assert ours.encode(text) == theirs.encode(text), text
        assert ours.decode(theirs.encode(text)) == text
    assert ours.eos_token == theirs.eos_token
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert ours.apply_chat_template(chat) == theirs.apply_chat_template(chat)


def serve_args(model: str):
    from freetoken.cli.serve import register
    p = argparse.ArgumentParser()
    register(p.add_subparsers(dest="command"))
    return p.parse_args(["serve", "--model", model, "--dtype", "float32", "--max-model-len", "512"])


def chat(app, model_name, messages=({"role": "user", "content": "hi"},)):
    # the context runs the app's lifespan (engine loop); Host must be a loopback name for the
    # request guard (TestClient's default "testserver" is a DNS name and refused, 403)
    with TestClient(app, base_url="http://localhost") as client:
        assert client.get("/v1/models").json()["data"][0]["id"] == model_name
        r = client.post("/v1/chat/completions", json={"model": model_name, "max_tokens": 5, "temperature": 0,
                                                      "messages": list(messages)})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss"])
def test_serve_a_gguf_path_and_an_ollama_name(tiny_dir, to_gguf, tmp_path, monkeypatch, arch):
    from freetoken.server.build import build
    g = to_gguf(tiny_dir(arch), "q8_0")
    _, _, app, demo, model = build(serve_args(str(g)))
    assert not demo and model == str(g)
    by_path = chat(app, g.stem)
    assert by_path["usage"]["completion_tokens"] <= 5

    models = tmp_path / "ollama"                # the same bytes as an Ollama blob
    digest = "sha256-" + hashlib.sha256(g.read_bytes()).hexdigest()
    (models / "blobs").mkdir(parents=True)
    shutil.copy(g, models / "blobs" / digest)
    manifest = models / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "q8"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model",
                                                "digest": digest.replace("-", ":", 1)}]}))
    monkeypatch.setenv("OLLAMA_MODELS", str(models))
    _, _, app2, _, model2 = build(serve_args("tiny:q8"))
    assert model2 == str(models / "blobs" / digest)
    by_name = chat(app2, "tiny:q8")
    assert by_name["choices"][0]["message"] == by_path["choices"][0]["message"]


# family -> (GGUF architecture, real chat template in ../shared/data/chat-templates, a marker it writes)
OWN_TEMPLATE = {"deepseek_v3": ("deepseek2", "deepseek-ai-DeepSeek-V3.1.jinja", "<\uff5cAssistant\uff5c>"),
                "glm4_moe": ("glm4moe", "GLM-4.6.jinja", "<|assistant|>")}


@pytest.mark.parametrize("arch", sorted(OWN_TEMPLATE))
def test_serve_deepseek2_and_glm4moe_ggufs_with_their_own_template(tiny_dir, to_gguf, tmp_path, arch):
    from freetoken.server.build import build
    gguf_arch, template_file, marker = OWN_TEMPLATE[arch]
    template_path = SHARED_DATA / "chat-templates" / template_file
    if not template_path.is_file():
        pytest.skip(f"real chat templates not found at {template_path.parent}")
    tiny = tiny_dir(arch, **({"scoring_func": "sigmoid"} if arch == "deepseek_v3" else {}))
    g = rewrite(to_gguf(tiny, "q8_0"), tmp_path / f"{gguf_arch}.gguf",
                set_keys={"tokenizer.chat_template": template_path.read_text()})
    assert GgufFile(g).arch == gguf_arch
    tok = Tokenizer(g)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    prompt = tok.apply_chat_template(messages)
    assert marker in prompt and "<|im_start|>" not in prompt       # the file's template, not the tiny one's
    ids = tok.encode(prompt)
    _, _, app, demo, _ = build(serve_args(str(g)))
    assert not demo
    r = chat(app, g.stem, messages)
    assert r["usage"]["prompt_tokens"] == len(ids)
    want = LLM(str(g), dtype="float32").generate([ids], SamplingParams(max_tokens=5, temperature=0))[0]
    assert r["usage"]["completion_tokens"] == len(want.token_ids) > 0
