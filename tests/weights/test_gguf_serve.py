"""A single .gguf file is a complete model: tokenizer and chat template from its metadata
agree with the checkpoint's own, and `serve --model` runs it (a path, or an Ollama name
resolved to the same file as a blob)."""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil

import pytest
from fastapi.testclient import TestClient

from freetoken.tokenizer import Tokenizer

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
    from freetoken.server.cli import register
    p = argparse.ArgumentParser()
    register(p.add_subparsers(dest="command"))
    return p.parse_args(["serve", "--model", model, "--dtype", "float32", "--max-model-len", "512"])


def chat(app, model_name):
    with TestClient(app) as client:            # the context runs the app's lifespan (engine loop)
        assert client.get("/v1/models").json()["data"][0]["id"] == model_name
        r = client.post("/v1/chat/completions", json={"model": model_name, "max_tokens": 5, "temperature": 0,
                                                      "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss"])
def test_serve_a_gguf_path_and_an_ollama_name(tiny_dir, to_gguf, tmp_path, monkeypatch, arch):
    from freetoken.server.cli import build
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
