"""Every command in README.md and docs/ that a user copies to start or call a local server
runs here, as written but for the model (a tiny one) and the port (a free one): the fenced
`freetoken serve` / `./ft serve` lines start a server, and the block's `curl` lines run
against it (issue 36: docs/memory.md's resize `curl -d` answered 415 as documented).
Synopsis lines (`[--opt N]`, `A|B`) are not commands; `--replicas`/`--ray-address` lines
are the Ray tests'; `freetoken launch` runs only where the agent is installed (the launch
tests cover it with fakes). A block is reported by file and line."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
LOCAL = re.compile(r"(?:https?://)?(?:localhost|127\.0\.0\.1):8000")
START_S = 240


@dataclass
class Block:
    where: str                  # file:line
    commands: list[list[str]]   # argv of each runnable command, in order


def _commands(body: str) -> list[str]:
    """Lines joined over trailing backslashes."""
    out, cur = [], ""
    for line in body.splitlines():
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        out.append(cur + line)
        cur = ""
    return [c for c in out if c.strip()]


def _synopsis(argv: list[str]) -> bool:
    return any(t.startswith("[") or t.endswith("]") or ("|" in t and not t.startswith("{")) or t == "..."
               or t.endswith("...") for t in argv)


def blocks() -> list[Block]:
    out = []
    for f in DOCS:
        text = f.read_text()
        for m in FENCE.finditer(text):
            if m.group(1) not in ("bash", "sh", "shell", "console", ""):
                continue
            cmds = []
            for line in _commands(m.group(2)):
                try:
                    argv = shlex.split(line, comments=True)
                except ValueError:
                    continue
                if argv and argv[0] in ("curl", "./ft", "freetoken") and not _synopsis(argv):
                    cmds.append(argv)
            if cmds:
                where = f"{f.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}"
                out.append(Block(where, cmds))
    return out


def _is_serve(argv) -> bool:
    return argv[:2] in (["freetoken", "serve"], ["./ft", "serve"])


def _targets_local(argv) -> bool:
    if _is_serve(argv):
        return not ({"--replicas", "--ray-address"} & set(argv))      # the Ray tests run those
    if argv[0] == "curl":
        return any(LOCAL.search(t) for t in argv)
    return argv[:2] == ["freetoken", "launch"]


LOCAL_BLOCKS = [b for b in blocks() if any(_targets_local(a) for a in b.commands)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _option(argv, name):
    return argv[argv.index(name) + 1] if name in argv[:-1] else None


def serve_argv(argv: list[str], model: Path, port: int) -> list[str]:
    """The documented serve command with the tiny model, a free port, a small KV cache."""
    args = list(argv[2:])
    if "--model" in args:
        args[args.index("--model") + 1] = str(model)
    if "--port" in args:
        args[args.index("--port") + 1] = str(port)
    else:
        args += ["--port", str(port)]
    if "--kv-cache-gib" not in args:
        args += ["--kv-cache-gib", "0.1"]
    return [sys.executable, "-m", "freetoken.cli", "serve", *args]


def curl_argv(argv: list[str], base: str) -> list[str]:
    out = [LOCAL.sub(base, t) for t in argv]
    return [out[0], "-sS", "-w", "\n%{http_code}", *out[1:]]


class Server:
    def __init__(self, argv: list[str], log: Path):
        self.log = log
        env = {k: v for k, v in os.environ.items() if k not in ("FREETOKEN_API_KEY",)}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        deadline = time.monotonic() + START_S
        while "READY http" not in log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"{' '.join(argv)} did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


@pytest.fixture(scope="module")
def docs_model(tmp_path_factory):
    from freetoken.tiny import make_tiny
    return make_tiny("qwen3_moe", tmp_path_factory.mktemp("docs-model"), max_position_embeddings=32768)


def test_the_docs_have_local_server_commands():
    """The extraction finds what it is meant to (a guard against a regex that finds nothing)."""
    where = {b.where.split(":")[0] for b in LOCAL_BLOCKS}
    assert {"README.md", "docs/server.md", "docs/memory.md"} <= where, where
    assert any(a[0] == "curl" for b in LOCAL_BLOCKS for a in b.commands)


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("block", LOCAL_BLOCKS, ids=[b.where for b in LOCAL_BLOCKS])
def test_documented_commands_run(block, docs_model, tmp_path):
    server, ran = None, 0
    base = None
    try:
        for argv in block.commands:
            if not _targets_local(argv):
                continue
            if _is_serve(argv):
                if server is not None:
                    server.stop()
                port = _free_port()
                server = Server(serve_argv(argv, docs_model, port), tmp_path / f"serve-{ran}.log")
                base = f"127.0.0.1:{port}"
            elif argv[0] == "curl":
                if server is None:           # a curl block of its own: a tiny server for it
                    port = _free_port()
                    server = Server(serve_argv(["freetoken", "serve", "--model", "DIR"], docs_model, port),
                                    tmp_path / "serve.log")
                    base = f"127.0.0.1:{port}"
                r = subprocess.run(curl_argv(argv, base), capture_output=True, text=True, timeout=120)
                body, _, code = r.stdout.rpartition("\n")
                assert r.returncode == 0 and code.startswith("2"), \
                    f"{block.where}: `{shlex.join(argv)}` -> curl exit {r.returncode}, HTTP {code}: {body[:500]} {r.stderr[:300]}"
            elif argv[:2] == ["freetoken", "launch"]:
                agent = argv[2]
                if shutil.which(agent) is None:
                    continue              # the agent is not installed here
                continue                  # an agent run needs a model that answers; the launch tests do it
            ran += 1
    finally:
        if server is not None:
            server.stop()
    if ran == 0:
        pytest.skip(f"{block.where}: nothing here could run on this machine")
