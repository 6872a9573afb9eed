"""One engine replica: its own process, engine and memory plan, serving the same FastAPI
app as `freetoken serve` (server/build.py `build`), driven in-process over ASGI with the
request the front end forwarded. It streams back the response start, the body chunks as
the app sends them, and last what the router needs to know about this replica's cache."""
from __future__ import annotations

import asyncio
import logging

from ray import serve

from .forward import HELLO, META, START, Forward
from ..build import build

log = logging.getLogger("freetoken.replicas")


def _scope(fwd: Forward) -> dict:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": fwd.method, "scheme": "http", "path": fwd.path,
            "raw_path": fwd.path.encode(), "query_string": fwd.query, "root_path": "",
            "headers": list(fwd.headers), "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0),
            "state": {}}


class EngineReplica:
    """The deployment class (wrapped by `serve.deployment` in app.py)."""

    def __init__(self, args):
        logging.basicConfig(level=getattr(args, "log_level", "info").upper(),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.llm, self.svc, self.app, self.demo, self.model = build(args)
        self.svc.start()                  # the app's lifespan would; here no lifespan runs
        ctx = serve.get_replica_context()
        self.replica_id = ctx.replica_id.unique_id
        log.warning("engine replica %s ready (model %s)", self.replica_id, self.model)

    def meta(self) -> dict:
        kv = self.svc.engine.kv_usage()
        return {"replica": self.replica_id, "evicted_blocks": kv.evicted if kv is not None else 0,
                "kv_blocks_total": kv.num_blocks if kv is not None else 0,
                "block_size": kv.block_size if kv is not None else 0}

    async def handle(self, fwd: Forward):
        """Run one HTTP request through the app: yields (START, status, headers), body
        bytes, then (META, {...}). Closing the stream early is a client disconnect."""
        out: asyncio.Queue = asyncio.Queue()
        gone = asyncio.Event()
        sent = False

        async def receive():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": fwd.body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(msg):
            await out.put(msg)

        async def run():
            try:
                await self.app(_scope(fwd), receive, send)
            finally:
                await out.put(None)

        yield (HELLO, self.replica_id)
        task = asyncio.ensure_future(run())
        try:
            while True:
                msg = await out.get()
                if msg is None:
                    break
                if msg["type"] == "http.response.start":
                    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in msg.get("headers", [])]
                    yield (START, msg["status"], headers)
                elif msg["type"] == "http.response.body":
                    if msg.get("body"):
                        yield bytes(msg["body"])
            await task                     # an exception the app did not turn into a response
            yield (META, self.meta())
        finally:
            gone.set()
            if not task.done():
                task.cancel()
                try:
                    await task
                except BaseException:  # noqa: BLE001 - cancelled
                    pass

    async def call(self, fwd: Forward) -> tuple[int, bytes]:
        """A small non-streaming request (/metrics, /health) as (status, body)."""
        status, chunks = 500, []
        async for item in self.handle(fwd):
            if isinstance(item, tuple) and item[0] == START:
                status = item[1]
            elif isinstance(item, (bytes, bytearray)):
                chunks.append(item)
        return status, b"".join(chunks)

    def pid(self, fwd: Forward | None = None) -> int:
        """This replica's process id (the fault tests kill it)."""
        import os
        return os.getpid()

    def __del__(self):
        try:
            self.svc.stop()
            self.llm.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
