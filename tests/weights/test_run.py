"""`freetoken run NAME`: pulls a missing model from the (local) Ollama registry, starts the
server, answers a one-shot prompt; on a terminal it is a chat REPL (/bye leaves) whose turns
stream from the server and keep the conversation."""
from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from registries import OllamaRegistry

ROOT = Path(__file__).resolve().parents[2]
SERVE = "--dtype float32 --max-model-len 512 --threads 1"


@pytest.fixture(scope="module")
def registry(tiny_dir, to_gguf):
    with OllamaRegistry() as r:
        r.add("tiny", "q8", [("application/vnd.ollama.image.model", to_gguf(tiny_dir("qwen3_moe"), "q8_0").read_bytes())])
        yield r


def run(tmp_path, registry, *args, stdin=None):
    env = {**os.environ, "OLLAMA_MODELS": str(tmp_path / "ollama"), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "freetoken.cli", "run", "tiny:q8", *args, "--registry",
                           registry.url, "--max-tokens", "6", "--temperature", "0", "--serve-args", SERVE],
                          env=env, cwd=ROOT, capture_output=True, stdin=stdin, timeout=240)


def test_run_pulls_then_answers_one_prompt(tmp_path, registry):
    p = run(tmp_path, registry, "hello there")
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert "pulling it" in p.stderr.decode()
    assert p.stdout.decode().strip()                       # the model's (random) answer
    assert (tmp_path / "ollama" / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "q8").is_file()
    again = run(tmp_path, registry, "hello there")        # present now: no pull, the same answer
    assert again.returncode == 0 and "pulling it" not in again.stderr.decode()
    assert again.stdout == p.stdout


def test_run_on_a_terminal_is_a_chat_until_bye(tmp_path, registry):
    master, slave = pty.openpty()
    os.write(master, b"hello there\n/clear\nhello there\n/bye\n")
    try:
        p = run(tmp_path, registry, stdin=slave)
    finally:
        os.close(slave)
        os.close(master)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    err = p.stderr.decode()
    assert "/bye" in err and "conversation cleared" in err
    answers = [a.strip() for a in p.stdout.decode().split(">>> ") if a.strip()]
    assert len(answers) == 2 and answers[0] == answers[1]   # /clear: the same first turn again
