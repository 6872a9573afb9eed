"""`freetoken serve --replicas 2 --host 127.0.0.1` keeps all of Ray on loopback (issue 36: the
GCS, raylet, worker and agent ports were open on every interface). The CLI runs as a user
runs it; every TCP socket that any process of its tree (and of its Ray temp dir) listens on
is listed from /proc and must be a loopback address, the Serve proxy's port among them.
Marked `ray`; skipped without the extra."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("ray.serve")

from listening import is_loopback, listening, tree  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
START_S = 400


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_replicas_on_loopback_listen_only_on_loopback(tiny_dir, tmp_path):
    model = tiny_dir("qwen3_moe", max_position_embeddings=32768)
    ray_tmp = tempfile.mkdtemp(prefix="rayloop", dir="/tmp")        # short: Ray's unix sockets live there
    port = _free_port()
    log = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "LD_PRELOAD")}
    env.update(PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p),
               RAY_USAGE_STATS_ENABLED="0", RAY_TMPDIR=ray_tmp)
    srv = subprocess.Popen(
        [sys.executable, "-m", "freetoken.cli", "serve", "--model", str(model), "--dtype", "float32",
         "--max-model-len", "4096", "--kv-cache-gib", "0.1", "--max-tokens-cap", "2", "--served-model-name", "m",
         "--replicas", "2", "--replica-cpus", "1", "--host", "127.0.0.1", "--port", str(port)],
        stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + START_S
        while "READY http" not in log.read_text():
            if srv.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"serve did not start (rc {srv.poll()}):\n{log.read_text()[-4000:]}")
            time.sleep(1)
        url = f"http://127.0.0.1:{port}"
        for i in range(2):
            r = httpx.post(url + "/v1/chat/completions", timeout=120, json={
                "model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": f"hello {i}"}]})
            assert r.status_code == 200, r.text
        h = httpx.get(url + "/health", timeout=60).json()
        assert h["replicas_configured"] == 2 and h["replicas_total"] == 2, h
        socks = listening(tree(srv.pid, (ray_tmp,)))
        assert f"127.0.0.1:{port}" in socks, socks             # the Serve proxy, where it was asked
        assert len(socks) >= 5, socks                            # GCS, raylet, workers... were seen
        exposed = {a: p for a, p in socks.items() if not is_loopback(a)}
        assert not exposed, f"listening beyond loopback: {exposed}"
    finally:
        if srv.poll() is None:
            srv.send_signal(signal.SIGTERM)
            try:
                srv.wait(120)
            except subprocess.TimeoutExpired:
                srv.kill()
        for d in Path("/proc").iterdir():          # whatever of that Ray instance is left, by id
            if d.name.isdigit():
                try:
                    if ray_tmp.encode() in (d / "cmdline").read_bytes():
                        os.kill(int(d.name), signal.SIGKILL)
                except OSError:
                    pass
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_listing_sees_a_wildcard_socket():
    """The listing itself: a socket this process opens on every interface is found and is
    not loopback (so an empty 'exposed' above means something)."""
    import socket
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        socks = listening(tree(os.getpid()))
        assert f"0.0.0.0:{port}" in socks and not is_loopback(f"0.0.0.0:{port}")
