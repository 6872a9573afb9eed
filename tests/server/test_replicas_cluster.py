"""`freetoken serve --replicas 2 --ray-address ADDR` joins a Ray cluster: a head started
here with `ray start --head --block` (its own port and temp dir, so no other Ray instance on
the machine is touched), the CLI run as a user runs it, requests answered by both replicas,
the Serve application living in that cluster. Marked `ray`; skipped without the extra."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("ray.serve")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
START_S = 300        # a fresh, loaded CI machine: Ray's head, then two engine replicas


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    env.update(PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p),
               RAY_USAGE_STATS_ENABLED="0")
    return env


def _wait_for(line: str, proc: subprocess.Popen, log: Path, what: str) -> None:
    """Until the process's log shows `line` (a port opening is not enough: Ray's GCS
    listens well before the head is up)."""
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if line in log.read_text():
            return
        if proc.poll() is not None:
            pytest.fail(f"{what} exited {proc.returncode}:\n{log.read_text()[-4000:]}")
        time.sleep(0.5)
    pytest.fail(f"{what} was not ready in {START_S} s:\n{log.read_text()[-4000:]}")


def _stop(proc: subprocess.Popen, timeout: float) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def _ours(temp_dir: str) -> list[int]:
    """Processes of this head still alive: their command lines name its temp dir."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if temp_dir.encode() in (d / "cmdline").read_bytes():
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


def test_serve_joins_a_ray_cluster(tiny_dir, tmp_path):
    ray_bin = Path(sys.executable).with_name("ray")
    model = tiny_dir("qwen3_moe", max_position_embeddings=32768)
    temp_dir = tempfile.mkdtemp(prefix="rayft", dir="/tmp")      # short: Ray's unix sockets live there
    gcs = _free_port()
    head_log, serve_log = tmp_path / "head.log", tmp_path / "serve.log"
    head = subprocess.Popen(
        [str(ray_bin), "start", "--head", "--block", f"--port={gcs}", "--num-cpus=2",
         f"--temp-dir={temp_dir}", "--include-dashboard=false", "--disable-usage-stats"],
        stdout=head_log.open("w"), stderr=subprocess.STDOUT, env=_env(), cwd=tmp_path)
    srv = None
    try:
        _wait_for("Ray runtime started", head, head_log, "`ray start --head`")
        http = _free_port()     # after the head is up: its processes took their ports (one took ours once)
        srv = subprocess.Popen(
            [sys.executable, "-m", "freetoken.cli", "serve", "--model", str(model), "--dtype", "float32",
             "--max-model-len", "4096", "--kv-cache-gib", "0.1", "--max-tokens-cap", "4",
             "--served-model-name", "m", "--replicas", "2", "--replica-cpus", "1",
             "--ray-address", f"127.0.0.1:{gcs}", "--host", "127.0.0.1", "--port", str(http)],
            stdout=serve_log.open("w"), stderr=subprocess.STDOUT, env=_env(), cwd=ROOT)
        _wait_for("READY http", srv, serve_log, "freetoken serve")
        url = f"http://127.0.0.1:{http}"
        seen = set()
        for i in range(4):        # four conversations: both replicas take some
            r = httpx.post(url + "/v1/chat/completions", timeout=120, json={
                "model": "m", "max_tokens": 2,
                "messages": [{"role": "user", "content": f"conversation {i}: " + "word " * (40 * i)}]})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["role"] == "assistant"
            seen.add(r.headers["x-freetoken-replica"])
        h = httpx.get(url + "/health", timeout=60).json()
        assert h["replicas_ok"] == 2, h
        assert len(seen) == 2, seen
        # the application lives in the cluster the head runs, not in a local instance
        probe = subprocess.run(
            [sys.executable, "-c", "import json, ray; from freetoken.server.replicas.app import _token_auth_if_token; "
             "_token_auth_if_token(); ray.init(address=%r, log_to_driver=False); "
             "print(json.dumps(ray.util.list_named_actors(all_namespaces=True)))" % f"127.0.0.1:{gcs}"],
            capture_output=True, text=True, timeout=180, env=_env())
        assert probe.returncode == 0, probe.stderr[-2000:]
        names = {a["name"] for a in json.loads(probe.stdout.strip().splitlines()[-1])}
        assert "SERVE_CONTROLLER_ACTOR" in names, names
    finally:
        if srv is not None:
            _stop(srv, 120)
        _stop(head, 120)
        for pid in _ours(temp_dir):          # anything the head's reaper missed
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(temp_dir, ignore_errors=True)
