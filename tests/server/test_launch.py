"""`freetoken launch`: the limits it reads from the server reach each agent's own settings,
auth failures and a missing server are named, key files are private, the printed command
survives the shell. The agents are stood in for by a script that records what it was given."""
from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from fake_engine import FakeEngine
from live_server import LiveServer, make_fake

ROOT = Path(__file__).resolve().parents[2]
RECORDER = """#!{python}
import json, os, sys
json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, open({out!r}, "w"))
"""


@pytest.fixture(scope="module")
def keyed():
    """A server with an API key, a 4096-token window and a 512-token output cap."""
    _, _, app = make_fake(FakeEngine(max_model_len=4096), api_key="sekret", max_tokens_cap=512)
    srv = LiveServer(app)
    yield srv.url
    srv.stop()


def run_launch(*argv, path_dir: Path | None = None, env: dict | None = None):
    e = dict(os.environ, **(env or {}))
    if path_dir is not None:
        e["PATH"] = f"{path_dir}{os.pathsep}{e['PATH']}"
    e["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "freetoken.cli", "launch", *argv],
                          capture_output=True, text=True, env=e, cwd=ROOT, timeout=60)


def recorder(tmp_path: Path, agent: str) -> tuple[Path, Path]:
    bin_dir, out = tmp_path / "bin", tmp_path / f"{agent}.json"
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / agent
    exe.write_text(RECORDER.format(python=sys.executable, out=str(out)))
    exe.chmod(0o755)
    return bin_dir, out


@pytest.mark.parametrize("agent", ["claude", "opencode", "openclaw"])
def test_launch_passes_the_servers_limits(keyed, agent, tmp_path):
    bin_dir, out = recorder(tmp_path, agent)
    cfg = tmp_path / "cfg"
    r = run_launch(agent, "--server", keyed, "--api-key", "sekret", "--config-dir", str(cfg),
                   "--", "agent", "exec", "it's a \"test\"", path_dir=bin_dir,
                   env={"ANTHROPIC_API_KEY": "cloud-key", "OPENAI_BASE_URL": "https://x"})
    assert r.returncode == 0, r.stderr
    seen = json.loads(out.read_text())
    env, argv = seen["env"], seen["argv"]
    assert "ANTHROPIC_API_KEY" not in env and "OPENAI_BASE_URL" not in env
    files = [f for f in cfg.rglob("*") if f.is_file()]
    assert files and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    assert stat.S_IMODE(cfg.stat().st_mode) & 0o077 == 0
    assert argv[-3:] == ["agent", "exec", "it's a \"test\""]
    # the cap (512) is below a quarter of the window (1024): agents are told the cap
    if agent == "claude":
        assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "4096"
        assert "CLAUDE_CODE_AUTO_COMPACT_WINDOW" not in env    # Claude Code's floor is 100k
        assert "compacts its history on its own only in a window of 100000" in r.stderr
        assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "512"
        assert env["ANTHROPIC_BASE_URL"] == keyed and env["ANTHROPIC_AUTH_TOKEN"] == "sekret"
    elif agent == "opencode":
        conf = json.loads(Path(env["OPENCODE_CONFIG"]).read_text())
        model = conf["provider"]["freetoken"]["models"]["capture-model"]
        assert model["limit"] == {"context": 4096, "input": 4096, "output": 512}
        assert conf["compaction"] == {"reserved": 1024}     # a quarter of the window, not the cap
    else:
        assert "--config" not in argv                # rejected by most subcommands
        conf = json.loads(Path(env["OPENCLAW_CONFIG_PATH"]).read_text())
        row = conf["models"]["providers"]["freetoken"]["models"][0]
        assert (row["contextWindow"], row["maxTokens"]) == (4096, 512)
        assert conf["agents"]["defaults"]["compaction"] == {"timeoutSeconds": 180}   # its default


def test_claude_gets_its_compact_window_from_100k(tmp_path):
    from freetoken.cli.launch import Limits, plan
    env, _, _ = plan("claude", "http://127.0.0.1:1", Limits("m", 131072, 8192), "k", tmp_path, [])
    assert env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "131072"


@pytest.mark.parametrize("context,seconds", [(4096, 180), (100000, 2000), (131072, 2622)])
def test_openclaw_waits_for_a_cold_whole_window_compaction(tmp_path, context, seconds):
    """OpenClaw aborts a compaction request after agents.defaults.compaction.timeoutSeconds
    (180 s by default); a cold 55k-token summary request took 132 s to its first token on the
    tiny model. `launch` allows a whole window at 50 prompt tokens/s."""
    from freetoken.cli.launch import Limits, plan
    _, files, _ = plan("openclaw", "http://127.0.0.1:1", Limits("m", context, 512), "k", tmp_path, [])
    conf = json.loads(next(iter(files.values())))
    assert conf["agents"]["defaults"]["compaction"]["timeoutSeconds"] == seconds


def test_an_older_key_file_becomes_private(keyed, tmp_path):
    bin_dir, _ = recorder(tmp_path, "claude")
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    old = cfg / "claude-settings.json"
    old.write_text("{}")
    old.chmod(0o644)
    assert run_launch("claude", "--server", keyed, "--api-key", "sekret", "--config-dir", str(cfg),
                      path_dir=bin_dir).returncode == 0
    assert stat.S_IMODE(old.stat().st_mode) == 0o600 and "sekret" in old.read_text()


@pytest.mark.parametrize("key,words", [(None, "none was given"), ("wrong", "rejected the one given")])
def test_auth_failure_is_named(keyed, tmp_path, key, words):
    args = ["claude", "--server", keyed, "--config-dir", str(tmp_path / "cfg")]
    r = run_launch(*args, *(["--api-key", key] if key else []), env={"FREETOKEN_API_KEY": ""})
    assert r.returncode == 1
    assert "requires an API key" in r.stderr and words in r.stderr and "--api-key" in r.stderr
    assert "does not answer" not in r.stderr and not (tmp_path / "cfg").exists()


def test_missing_server_is_named_and_dry_run_says_it_assumes(tmp_path):
    r = run_launch("opencode", "--server", "http://127.0.0.1:9", "--config-dir", str(tmp_path))
    assert r.returncode == 1 and "no FreeToken server answers at http://127.0.0.1:9" in r.stderr
    r = run_launch("opencode", "--server", "http://127.0.0.1:9", "--dry-run")
    assert r.returncode == 0
    assert "ASSUMED" in r.stderr and "# WARNING: no server answered" in r.stdout


def test_dry_run_prints_a_command_the_shell_gives_back(keyed, tmp_path):
    arg = "it's $HOME and \"quotes\""
    r = run_launch("openclaw", "--server", keyed, "--api-key", "sekret", "--config-dir",
                   str(tmp_path / "my cfg"), "--dry-run", "--", "agent", "exec", arg)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert shlex.split(lines[-1]) == ["openclaw", "agent", "exec", arg]
    exports = {ln.split("=", 1)[0][7:]: shlex.split(ln.split("=", 1)[1])[0]
               for ln in lines if ln.startswith("export ")}
    assert exports["OPENCLAW_CONFIG_PATH"] == str(tmp_path / "my cfg" / "openclaw.json5")
    assert not (tmp_path / "my cfg").exists()


def test_claude_runs_in_its_own_profile_with_the_users_settings_layered(tmp_path, monkeypatch):
    """Claude Code rewrites the settings.json of the profile it runs in ("model": "opus" became
    "opus[1m]" under ANTHROPIC_DEFAULT_OPUS_MODEL): launch gives it a profile of its own
    (CLAUDE_CONFIG_DIR) with a copy of the user's settings, less what points elsewhere."""
    from freetoken.cli.launch import Limits, plan
    monkeypatch.delenv("CLAUDE_CONFIG_DIR", raising=False)
    home, cfg = tmp_path / "home", tmp_path / "cfg"
    (home / ".claude").mkdir(parents=True)
    user = {"model": "opus", "permissions": {"allow": ["Bash(ls:*)"]}, "apiKeyHelper": "pass show x",
            "env": {"ANTHROPIC_API_KEY": "cloud", "ANTHROPIC_BASE_URL": "https://cloud",
                    "MY_TOOL_FLAG": "1"}, "hooks": {"Stop": []}}
    (home / ".claude" / "settings.json").write_text(json.dumps(user))
    env, files, cmd = plan("claude", "http://127.0.0.1:1", Limits("m", 131072, 8192), "k", cfg, [],
                           home=home)
    profile = cfg / "claude"
    assert env["CLAUDE_CONFIG_DIR"] == str(profile)
    assert all(str(p).startswith(str(cfg)) for p in files)          # nothing under the user's HOME
    layered = json.loads(files[profile / "settings.json"])
    assert layered == {"permissions": {"allow": ["Bash(ls:*)"]}, "env": {"MY_TOOL_FLAG": "1"},
                       "hooks": {"Stop": []}}
    ours = json.loads(files[cfg / "claude-settings.json"])         # --settings: above the user's layer
    assert cmd[:3] == ["claude", "--settings", str(cfg / "claude-settings.json")]
    assert ours["model"] == "m" and ours["env"]["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:1"


def test_claude_profile_without_user_settings(tmp_path, monkeypatch):
    from freetoken.cli.launch import Limits, plan
    monkeypatch.delenv("CLAUDE_CONFIG_DIR", raising=False)
    _, files, _ = plan("claude", "http://x", Limits("m", 4096, 512), "k", tmp_path / "c", [],
                       home=tmp_path / "nohome")
    assert json.loads(files[tmp_path / "c" / "claude" / "settings.json"]) == {}


def test_dry_run_unsets_the_cloud_variables_before_it_exports(keyed):
    """The printed lines, run by a shell, leave our ANTHROPIC_BASE_URL set (an `unset` after
    the exports cleared the names both lists share)."""
    r = run_launch("claude", "--server", keyed, "--api-key", "sekret", "--dry-run")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    unset = next(i for i, ln in enumerate(lines) if ln.startswith("unset "))
    assert unset < min(i for i, ln in enumerate(lines) if ln.startswith("export "))
    script = "\n".join(ln for ln in lines if ln.startswith(("unset ", "export ")))
    out = subprocess.run(["bash", "-c", script + '\necho "$ANTHROPIC_BASE_URL|$ANTHROPIC_AUTH_TOKEN"'],
                         capture_output=True, text=True, env=dict(os.environ, ANTHROPIC_BASE_URL="https://cloud"))
    assert out.stdout.strip() == f"{keyed}|sekret"


def test_launch_help_has_one_options_section():
    r = run_launch("--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("options:") == 1 and "--dry-run" in r.stdout
    assert "--skip-window-check" in r.stdout and r.stdout.startswith("usage: freetoken launch")
