"""Does the server's window hold an agent's first request and a reply? `freetoken launch`
measures it instead of guessing: it runs the agent once, in a scratch HOME, against a
one-shot listener that records the first request carrying tools (the agent's fixed system
prompt + tool definitions + a one-word task) and answers 503, then has the server count that
request through the model's own chat template (/v1/messages/count_tokens).

An agent whose first request does not fit is unusable: OpenCode in an 8192 window loops
overflow -> compaction -> overflow forever, OpenClaw at 32768 overflows on turn 1."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from ..server.guards.private_file import write_private

# a one-turn, non-interactive run of each agent (its first model request is all we need)
PROBE_ARGS = {"claude": ["-p", "hi"], "opencode": ["run", "hi"],
              "openclaw": ["agent", "--local", "--agent", "main", "--message", "hi"]}
PROBE_TIMEOUT_S = 120     # OpenClaw 2026.9.6 takes ~50 s to its first request on a busy 2-core box


class _Listener(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.first: dict | None = None
        self.got = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _Listener

    def do_POST(self):  # noqa: N802 - http.server's name
        n = int(self.headers.get("content-length") or 0)
        try:
            body = json.loads(self.rfile.read(n) or b"{}")
        except ValueError:
            body = {}
        if isinstance(body, dict) and body.get("tools") and self.server.first is None:
            self.server.first = {"path": self.path, "body": body}
            self.server.got.set()
        self._answer(503, {"type": "error", "error": {"type": "overloaded_error", "message":
                                                      "freetoken launch is measuring the prompt"}})

    def do_GET(self):  # noqa: N802
        self._answer(404, {"error": "not here"})

    do_HEAD = do_GET

    def _answer(self, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, *args):
        pass


def capture_first_request(make_plan, exe: str, timeout: float = PROBE_TIMEOUT_S) -> dict | None:
    """The agent's first request with tools ({"path", "body"}), or None if it sent none in
    `timeout` seconds. `make_plan(url, cfg_dir, home)` gives (env, files, argv) for a server at
    url, configs under cfg_dir; the run's HOME is a scratch folder, so no user file is read
    or written by it."""
    srv = _Listener()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with tempfile.TemporaryDirectory(prefix="freetoken-probe-") as tmp:
            home, cfg = Path(tmp) / "home", Path(tmp) / "cfg"
            home.mkdir()
            env, files, argv = make_plan(srv.url, cfg, home)
            for path, text in files.items():
                write_private(path, text)
            full = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TERM", "TMPDIR")}
            full.update(env, HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"),
                        XDG_DATA_HOME=str(home / ".local/share"), XDG_STATE_HOME=str(home / ".local/state"),
                        XDG_CACHE_HOME=str(home / ".cache"))
            proc = subprocess.Popen([exe, *argv[1:]], env=full, cwd=home, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    start_new_session=True)
            try:
                deadline = time.monotonic() + timeout
                while not srv.got.wait(0.1) and proc.poll() is None and time.monotonic() < deadline:
                    pass
            finally:
                _end(proc)
    finally:
        srv.shutdown()
        srv.server_close()
    return srv.first


def _end(proc: subprocess.Popen) -> None:
    """Stop the probe run and whatever it started (its own process group)."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue


def as_messages_request(captured: dict, model: str) -> dict:
    """An Anthropic count_tokens body for a captured /v1/messages or /v1/chat/completions
    request (the agent's first turn: system, user text, tools)."""
    body = captured["body"]
    if "chat/completions" not in captured["path"]:
        out = {k: body[k] for k in ("system", "messages", "tools") if k in body}
        return dict(out, model=model)
    system, messages = [], []
    for m in body.get("messages", []):
        text = _text(m.get("content"))
        if m.get("role") in ("system", "developer"):
            system.append(text)
        else:
            messages.append({"role": "assistant" if m.get("role") == "assistant" else "user",
                             "content": text or " "})
    tools = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
              "input_schema": t["function"].get("parameters") or {"type": "object"}}
             for t in body.get("tools", []) if isinstance(t, dict) and "function" in t]
    return {"model": model, "system": "\n\n".join(system), "messages": messages or
            [{"role": "user", "content": " "}], "tools": tools}


def _text(content) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))


def count_tokens(server: str, api_key: str | None, body: dict) -> int:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    r = httpx.post(server.rstrip("/") + "/v1/messages/count_tokens", json=body, headers=headers,
                   timeout=120)
    r.raise_for_status()
    return int(r.json()["input_tokens"])


def window_needed(first_request: int, room_at) -> int:
    """The smallest window (a multiple of 1024) whose free room after the first request is
    at least room_at(window): a reply and the agent's compaction headroom (with less, the
    agent compacts before every request, forever)."""
    w = -(-(first_request + 1) // 1024) * 1024
    while w - first_request < room_at(w):
        w += 1024
    return w
