"""`launch` measures the agent's first request before starting it: the agent runs once in a
scratch HOME against a one-shot listener, the captured request is counted by the server, and
a window that cannot hold it plus a reply and the compaction headroom is refused with the
window it needs. The agents are stood in for by a script that sends the request the real one
sent (the captured client requests in shared/data) to wherever its configuration points."""
from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
from fake_engine import FakeEngine
from live_server import FIXTURES, LiveServer, make_fake
from test_launch import run_launch

from freetoken.cli import agent_window as aw
from freetoken.cli.launch import agent_output, compact_headroom

REQUESTS = Path(os.environ.get("FREETOKEN_CLIENT_REQUESTS") or FIXTURES)
FIRST = {"claude": "claude-code/01-messages-stream-first-turn.json",
         "opencode": "opencode/02-chat-main-turn.json",
         "openclaw": "openclaw/01-chat-completions-turn.json"}
pytestmark = pytest.mark.skipif(not (REQUESTS / FIRST["claude"]).is_file(),
                                reason=f"client-request fixtures not found at {REQUESTS}")

# An agent that sends its captured first request where its configuration points, and records
# where it ran (HOME) and what it was given.
AGENT = """#!{python}
import json, os, sys, httpx
agent, fixture, log = {agent!r}, {fixture!r}, {log!r}
if agent == "claude":
    url = os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages"
elif agent == "opencode":
    url = json.load(open(os.environ["OPENCODE_CONFIG"]))["provider"]["freetoken"]["options"]["baseURL"] + "/chat/completions"
else:
    conf = json.load(open(os.environ["OPENCLAW_CONFIG_PATH"]))
    url = conf["models"]["providers"]["freetoken"]["baseUrl"] + "/chat/completions"
body = json.load(open(fixture))["body"]
with open(log, "a") as f:    # before the request: the probe stops the agent once it is sent
    f.write(json.dumps({{"home": os.environ["HOME"], "argv": sys.argv[1:], "url": url}}) + "\\n")
status = httpx.post(url, json=dict(body, stream=False), timeout=30).status_code
with open(log, "a") as f:
    f.write(json.dumps({{"status": status, "url": url}}) + "\\n")
"""


def fake_agent(tmp_path: Path, agent: str) -> tuple[Path, Path]:
    import sys
    bin_dir, log = tmp_path / "bin", tmp_path / f"{agent}.log"
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / agent
    exe.write_text(AGENT.format(python=sys.executable, agent=agent, fixture=str(REQUESTS / FIRST[agent]),
                                log=str(log)))
    exe.chmod(0o755)
    return bin_dir, log


def logged(log: Path, key: str = "argv") -> list[dict]:
    return [r for r in map(json.loads, log.read_text().splitlines()) if key in r]


@pytest.fixture(scope="module")
def small():
    """A server with an 8192-token window (one token per byte)."""
    _, _, app = make_fake(FakeEngine(max_model_len=8192))
    srv = LiveServer(app)
    yield srv.url
    srv.stop()


@pytest.fixture(scope="module")
def large():
    _, _, app = make_fake(FakeEngine(max_model_len=1 << 20))
    srv = LiveServer(app)
    yield srv.url
    srv.stop()


def counted(url: str, agent: str) -> int:
    """The fixture's first request counted by the server directly (independent of the probe)."""
    body = json.loads((REQUESTS / FIRST[agent]).read_text())["body"]
    path = "/v1/messages" if agent == "claude" else "/v1/chat/completions"
    return aw.count_tokens(url, None, aw.as_messages_request({"path": path, "body": body}, "capture-model"))


@pytest.mark.parametrize("agent", ["claude", "opencode", "openclaw"])
def test_a_window_too_small_is_refused_with_the_window_it_needs(small, agent, tmp_path):
    bin_dir, log = fake_agent(tmp_path, agent)
    cfg = tmp_path / "cfg"
    r = run_launch(agent, "--server", small, "--config-dir", str(cfg), path_dir=bin_dir,
                   env={"HOME": str(tmp_path / "home")})
    assert r.returncode == 1, r.stderr
    first = counted(small, agent)
    assert first > 8192
    need = aw.window_needed(first, lambda w: compact_headroom(w, agent_output(w, 8191)))
    assert f"({first} tokens: its system prompt and tools)" in r.stderr
    assert f"--max-model-len {need}" in r.stderr and "Nothing was started" in r.stderr
    assert not cfg.exists()                                   # nothing written
    runs = logged(log)
    assert len(runs) == 1 and not runs[0]["url"].startswith(small)        # only the probe ran, at the listener
    assert runs[0]["home"] != str(tmp_path / "home")          # in a scratch HOME
    assert runs[0]["argv"][-len(aw.PROBE_ARGS[agent]):] == aw.PROBE_ARGS[agent]


def test_the_needed_window_is_enough(large, tmp_path):
    """A server with exactly the window the refusal named lets the agent start."""
    first = counted(large, "opencode")
    need = aw.window_needed(first, lambda w: compact_headroom(w, agent_output(w, None)))
    assert need % 1024 == 0 and need - first >= compact_headroom(need, agent_output(need, None))
    assert need - 1024 - first < compact_headroom(need - 1024, agent_output(need - 1024, None))
    _, _, app = make_fake(FakeEngine(max_model_len=need))
    srv = LiveServer(app)
    try:
        bin_dir, log = fake_agent(tmp_path, "opencode")
        r = run_launch("opencode", "--server", srv.url, "--config-dir", str(tmp_path / "cfg"),
                       "--", "run", "go", path_dir=bin_dir)
        assert r.returncode == 0, r.stderr
        assert f"opencode's first request is {first} tokens; the window is {need}" in r.stderr
        runs = logged(log)
        assert [x["argv"] for x in runs] == [aw.PROBE_ARGS["opencode"], ["run", "go"]]   # probe, then the run
        assert runs[1]["url"] == srv.url + "/v1/chat/completions"
        assert logged(log, "status")[-1] == {"status": 200, "url": runs[1]["url"]}
    finally:
        srv.stop()


def test_skip_window_check_starts_at_once(small, tmp_path):
    bin_dir, log = fake_agent(tmp_path, "opencode")
    r = run_launch("opencode", "--server", small, "--config-dir", str(tmp_path / "cfg"),
                   "--skip-window-check", path_dir=bin_dir)
    assert r.returncode == 0, r.stderr
    assert "measuring" not in r.stderr and len(logged(log)) == 1


def test_an_agent_that_sends_nothing_is_only_a_warning(small, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "opencode").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "opencode").chmod(0o755)
    r = run_launch("opencode", "--server", small, "--config-dir", str(tmp_path / "cfg"),
                   path_dir=bin_dir)
    assert r.returncode == 0, r.stderr
    assert "sent no request" in r.stderr and "the window was not checked" in r.stderr


def test_a_captured_chat_request_counts_like_its_messages_form(large):
    """OpenCode's agent turn captured on both APIs (same prompt and tools): the chat form,
    converted for count_tokens, counts within 2% of the Messages form."""
    chat = json.loads((REQUESTS / "opencode/02-chat-main-turn.json").read_text())["body"]
    msgs = json.loads((REQUESTS / "opencode/06-anthropic-main-turn.json").read_text())["body"]
    a = aw.count_tokens(large, None, aw.as_messages_request({"path": "/v1/chat/completions", "body": chat}, "m"))
    b = aw.count_tokens(large, None, aw.as_messages_request({"path": "/v1/messages", "body": msgs}, "m"))
    assert abs(a - b) <= 0.02 * b, (a, b)
    assert httpx.get(large + "/health").status_code == 200
