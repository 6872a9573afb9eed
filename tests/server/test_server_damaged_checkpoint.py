"""Damaged or inconsistent checkpoint files stop `serve` and `generate` at load with one
line naming the file (exit 2), never a traceback or a server that fails every request."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from freetoken.cli import main


def _json(d, name, fn):
    p = d / name
    p.write_text(fn(json.loads(p.read_text())) if fn else "{not json")


def _weights(d, fn):
    for f in d.glob("*.safetensors"):
        save_file({k: fn(v) for k, v in load_file(f).items()}, f, metadata={"format": "pt"})


def _truncate(d):
    for f in d.glob("*.safetensors"):
        f.write_bytes(f.read_bytes()[:-1000])


def _experts(c):
    c["num_experts_per_tok"] = c.get("num_experts", c.get("num_local_experts")) + 3
    return json.dumps(c)


DAMAGE = {
    "tokenizer_config-json": ("tokenizer_config.json", lambda d: _json(d, "tokenizer_config.json", None)),
    "generation_config-json": ("generation_config.json", lambda d: _json(d, "generation_config.json", None)),
    "generation_config-list": ("generation_config.json", lambda d: (d / "generation_config.json").write_text("[1]")),
    "chat_template": ("tokenizer_config.json", lambda d: _json(
        d, "tokenizer_config.json", lambda c: json.dumps({**c, "chat_template": "{% for x in %}"}))),
    "top-k-over-experts": ("config.json", lambda d: _json(d, "config.json", _experts)),
    "nan-weights": ("model.safetensors", lambda d: _weights(d, lambda v: torch.full_like(v, float("nan")))),
    "int-weights": ("model.safetensors", lambda d: _weights(
        d, lambda v: v.to(torch.int32) if v.is_floating_point() else v)),
    "truncated": ("model.safetensors", _truncate),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", sorted(DAMAGE))
@pytest.mark.parametrize("command", ["generate", "serve"])
def test_damaged_checkpoint_is_one_line_exit_2(tiny_model_dir, tmp_path, capsys, kind, command):
    d = tmp_path / "ckpt"
    shutil.copytree(tiny_model_dir, d)
    file, damage = DAMAGE[kind]
    damage(d)
    argv = (["generate", "--chat", "--prompt", "hi", "--max-tokens", "2"] if command == "generate"
            else ["serve", "--port", "0", "--max-model-len", "512"])
    rc = main([argv[0], "--model", str(d), *argv[1:]])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    assert err[-1].startswith("freetoken: error: ") and file in err[-1], err
