"""`serve` as a process: the random demo model asked for by name (`freetoken-demo`), a ready line with the
URL, the API key from a file (not in argv), graceful SIGTERM; `launch --dry-run` for each agent."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_dir):
    from freetoken.server.build import demo_model_dir
    cache = tmp_path_factory.mktemp("cache")
    # the demo model is normally built on first use; reuse the session's tiny checkpoint
    demo = cache / "freetoken" / demo_model_dir().name
    demo.parent.mkdir(parents=True)
    demo.symlink_to(tiny_model_dir, target_is_directory=True)
    # and this process's compiled kernels and calibrations: built afresh under the new cache they
    # took minutes on a loaded 2-core Zen 1 (CI, stop 48), past the ready deadline below
    from freetoken.kernels import cache_dir
    cache_dir().mkdir(parents=True, exist_ok=True)
    (cache / "freetoken" / "kernels").symlink_to(cache_dir(), target_is_directory=True)
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), PYTHONUNBUFFERED="1")
    key_file = cache / "key"
    key_file.write_text("sekret\n")
    p = subprocess.Popen([sys.executable, "-m", "freetoken.cli", "serve", "--model", "freetoken-demo", "--port", "0",
                          "--api-key-file", str(key_file), "--max-model-len", "2048"],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, url = [], None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("READY "):
            url = line.split()[1]
            break
    assert url, "".join(lines)
    yield p, url, lines, cache
    if p.poll() is None:
        p.kill()
        p.wait()


def test_demo_model_ready_and_key(served):
    p, url, lines, cache = served
    log = "".join(lines)
    assert "RANDOM-WEIGHT DEMO" in log and "ready on http://127.0.0.1:" in log
    assert list((cache / "freetoken").glob("demo-qwen3_moe*/config.json"))
    assert httpx.get(url + "/health").json()["status"] == "ok"
    assert httpx.get(url + "/v1/models").status_code == 401
    assert b"sekret" not in Path(f"/proc/{p.pid}/cmdline").read_bytes()     # what ps shows
    r = httpx.post(url + "/v1/messages", headers={"x-api-key": "sekret"}, timeout=60, json={
        "model": "claude-x", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.json()["usage"]["output_tokens"] <= 4


def launch(*argv):
    import argparse

    from freetoken.cli.serve import register
    p = argparse.ArgumentParser()
    register(p.add_subparsers(dest="command"))
    args = p.parse_args(["launch", *argv])
    return args.func(args)


@pytest.mark.parametrize("agent", ["claude", "opencode", "openclaw"])
def test_launch_dry_run(served, agent, tmp_path, capsys):
    _, url, _, _ = served
    rc = launch(agent, "--server", url, "--api-key", "sekret", "--config-dir", str(tmp_path),
                "--dry-run", "--", "-p", "say hi")
    out = capsys.readouterr().out
    assert rc == 0
    assert url in out and "freetoken-demo" in out and "say hi" in out
    assert "anthropic.com" not in out and "openai.com" not in out
    assert not list(tmp_path.iterdir()), "--dry-run must not write files"


def test_launch_refuses_without_server(tmp_path, capsys):
    assert launch("claude", "--server", "http://127.0.0.1:9", "--config-dir", str(tmp_path)) == 1
    assert "Nothing was started" in capsys.readouterr().err
    assert not tmp_path.exists() or not list(tmp_path.iterdir())


def test_sigterm_graceful_shutdown(served):
    p, url, _, _ = served
    p.send_signal(signal.SIGTERM)
    rest = p.communicate(timeout=30)[0]
    assert p.returncode == 0, rest
    assert "server stopped" in rest


def test_a_busy_port_fails_at_once_before_the_model_loads(tmp_path):
    """The port is bound before the model loads: with it taken, `serve` names the port in one
    line and exits, without touching the model (a path that does not exist would fail the load)."""
    import socket
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        r = subprocess.run([sys.executable, "-m", "freetoken.cli", "serve", "--port", str(port),
                            "--model", str(tmp_path / "no-such-model")], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
    finally:
        taken.close()
    assert r.returncode == 2                 # one exit code and prefix for every CLI error
    lines = r.stderr.strip().splitlines()
    assert lines == [f"freetoken: error: port {port} on 127.0.0.1 is already in use (another server? "
                     f"pick one with --port)"], r.stderr
