"""`freetoken run`'s two halves: the server in a child process (the ordinary `freetoken serve`,
so every serve option works) and a terminal chat against its OpenAI route, streaming, like
`ollama run`. The child's stderr (load progress, errors) is relayed to ours; its stdout says
`READY <url>` once it answers."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import httpx

from ..errors import FreeTokenError

HELP = "/bye (or Ctrl-D) leaves, /clear forgets the conversation, /? shows this; Ctrl-C stops an answer"


class ServerProcess:
    """`freetoken serve --model NAME` on a loopback port; `url` once it is ready."""

    def __init__(self, model: str, serve_args: list[str], port: int = 0):
        env = dict(os.environ)
        env.setdefault("FREETOKEN_PROGRESS", "bar" if sys.stderr.isatty() else "log")
        cmd = [sys.executable, "-m", "freetoken.cli", "serve", "--model", model, "--host", "127.0.0.1",
               "--port", str(port), "--log-level", "error", *serve_args]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env, start_new_session=True)   # Ctrl-C stops an answer, not the server
        self.url: str | None = None
        self._ready = threading.Event()
        threading.Thread(target=self._stdout, daemon=True).start()
        threading.Thread(target=self._stderr, daemon=True).start()

    def _stdout(self) -> None:
        for line in self.proc.stdout:
            text = line.decode(errors="replace").strip()
            if text.startswith("READY ") and self.url is None:
                self.url = text.split(None, 1)[1]
                self._ready.set()
        self._ready.set()               # exited: wait() below reports it

    def _stderr(self) -> None:
        out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
        while chunk := self.proc.stderr.read1(65536):
            if out is not None:
                out.write(chunk)
                out.flush()
            else:
                sys.stderr.write(chunk.decode(errors="replace"))

    def wait_ready(self) -> str:
        while not self._ready.wait(0.5):
            pass
        if self.url is None:
            code = self.proc.wait()
            raise FreeTokenError(f"the server exited with status {code} before it was ready (its errors are above)")
        return self.url

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def stream_reply(url: str, model: str, messages: list[dict], options: dict, out=sys.stdout) -> str:
    """Streams one answer to `out` (reasoning dimmed on a terminal) and returns its content."""
    body = {"model": model, "messages": messages, "stream": True, **options}
    dim = out.isatty() if hasattr(out, "isatty") else False
    content, thinking = [], False
    with httpx.Client(timeout=httpx.Timeout(30.0, read=None)) as http, \
            http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            r.read()
            try:
                msg = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                msg = r.text[:300]
            raise FreeTokenError(f"the server answered {r.status_code}: {msg}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("error"):
                raise FreeTokenError(f"generation failed: {chunk['error'].get('message')}")
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                if delta.get("reasoning_content"):
                    if not thinking:
                        out.write("\x1b[2m" if dim else "[thinking] ")
                        thinking = True
                    out.write(delta["reasoning_content"])
                if delta.get("content"):
                    if thinking:
                        out.write("\x1b[0m\n" if dim else "\n[answer] ")
                        thinking = False
                    out.write(delta["content"])
                    content.append(delta["content"])
                out.flush()
    if thinking and dim:
        out.write("\x1b[0m")
    out.write("\n")
    out.flush()
    return "".join(content)


def repl(url: str, model: str, options: dict, system: str | None = None) -> int:
    """The terminal chat: one line per user turn, the conversation kept until /clear or /bye."""
    start = [{"role": "system", "content": system}] if system else []
    messages = list(start)
    print(f"chatting with {model} ({url}); {HELP}", file=sys.stderr)
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:
            print()
            continue
        text = line.strip()
        if not text:
            continue
        if text in ("/bye", "/exit", "/quit"):
            return 0
        if text == "/clear":
            messages = list(start)
            print("(conversation cleared)", file=sys.stderr)
            continue
        if text in ("/?", "/help"):
            print(HELP, file=sys.stderr)
            continue
        messages.append({"role": "user", "content": line})
        try:
            reply = stream_reply(url, model, messages, options)
        except KeyboardInterrupt:
            print("\n(stopped)", file=sys.stderr)
            messages.pop()
            continue
        messages.append({"role": "assistant", "content": reply})
