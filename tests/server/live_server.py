"""A uvicorn server on 127.0.0.1 (free port) in a thread, and app factories for tests."""
from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import uvicorn

from freetoken.server.app import create_app
from freetoken.server.generation import GenerationService
from freetoken.server.server_state import ServerSettings

from fake_engine import FakeEngine, FakeParams

from helpers import SHARED_DATA                     # found from a git worktree one level deeper too
FIXTURES = SHARED_DATA / "client-requests"
MODEL_NAMES = ["capture-model", "capture-reasoner"]   # the ids the captured clients asked for


class LiveServer:
    def __init__(self, app, make_server=None):
        """make_server(config kwargs) -> a uvicorn.Server; default a plain one."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        if make_server is None:
            self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                                        timeout_graceful_shutdown=2))
        else:
            self.server = make_server(dict(log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("test server did not start")
            time.sleep(0.02)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)


def make_fake(engine=None, **service_kw):
    engine = engine or FakeEngine()
    kw = dict(model_name=MODEL_NAMES[0], architecture="Qwen3MoeForCausalLM", max_running=8,
              max_waiting=16, params_cls=FakeParams)
    api_key = service_kw.pop("api_key", None)
    model_match = service_kw.pop("model_match", "auto")
    settings = {k: service_kw.pop(k) for k in ("max_body_bytes",) if k in service_kw}
    kw.update(service_kw)
    svc = GenerationService(engine, **kw)
    app = create_app(svc, ServerSettings(model_names=MODEL_NAMES, api_key=api_key, model_match=model_match,
                                   **settings))
    return engine, svc, app
