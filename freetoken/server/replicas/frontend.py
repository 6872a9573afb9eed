"""The HTTP front end of the replicas: one light Ray Serve deployment (no engine, no
weights) that owns the public routes. For each request it computes the routing key (the
prompt's token blocks, rendered as the replica will render them) and the session, and
forwards the raw request to the engine deployment, whose prefix-aware router picks the
replica; the replica runs the very app `freetoken serve` runs. It answers /health and
/metrics itself from every replica's, and ends a stream whose replica died with the
protocol's error event."""
from __future__ import annotations

import asyncio
import logging

import hmac
import json

from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..api import sse
from ..app import _key_from, needs_api_key
from ..errors import APIError, Unauthorized, error_body, error_response, is_anthropic_path
from ..operations.metrics import Metrics
from .forward import HELLO, META, START, Forward
from .health import health_body
from .merge_metrics import merge_pages
from .route_key import prompt_ids, session_of
from .registry import router_for
from .table import block_hashes
from freetoken.tokenizer import Tokenizer

log = logging.getLogger("freetoken.replicas")

GENERATION_PATHS = {"/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/completions"}
TARGETED_TIMEOUT_S = 10.0     # /health and /metrics wait at most this for one replica
LOOPBACK_HOST = (b"host", b"localhost")   # the replica's Host guard refuses a request without one
ATTEMPTS = 2                  # a replica that dies before answering: once more, elsewhere


def stream_error_event(path: str, message: str) -> str:
    """The protocol's error event for a stream that already started."""
    err = APIError(message, status=503)
    if is_anthropic_path(path):
        return sse.event("error", error_body(err, anthropic=True))
    if path == "/v1/responses":
        return sse.event("error", {"type": "error", "sequence_number": 0, "code": "server_error",
                                   "message": message, "param": None})
    return sse.data(error_body(err, anthropic=False)) + sse.DONE


@serve.deployment(name="frontend", num_replicas=1, ray_actor_options={"num_cpus": 0},
                  max_ongoing_requests=10_000)
class Frontend:
    def __init__(self, engine, *, api_key: str | None, engine_name: str, model_dir: str,
                 block_size: int, replicas: int = 1):
        self.engine = engine
        self.configured = replicas            # --replicas: /health reports alive of configured
        self.api_key, self.engine_name = api_key, engine_name
        self.metrics = Metrics()
        self.block_size = block_size
        try:
            self.tokenizer = Tokenizer(model_dir)
        except Exception as e:  # noqa: BLE001 - routing by load only then
            log.warning("no tokenizer for routing keys (%s): routing by load only", e)
            self.tokenizer = None

    async def __call__(self, request: Request):
        p = request.url.path
        if self.api_key and needs_api_key(p):
            key = _key_from(request)
            if key is None or not hmac.compare_digest(key.encode(), self.api_key.encode()):
                self.metrics.http_errors.labels("401").inc()
                return error_response(Unauthorized(
                    "invalid or missing API key: send it as 'Authorization: Bearer KEY' or "
                    "'x-api-key: KEY'"), p)
        if p == "/health" and request.method in ("GET", "HEAD"):
            return await self.health()
        if p == "/metrics" and request.method == "GET":
            return await self.metrics_page()
        return await self.forward(request)

    # --- replicas one by one ------------------------------------------------------
    async def _router(self):
        for _ in range(100):
            r = router_for(self.engine_name)
            if r is not None and r.live_replicas():
                return r
            if r is None:
                self.engine._init()           # the handle makes its router on first use
            await asyncio.sleep(0.05)
        return router_for(self.engine_name)

    async def _each(self, path: str) -> dict:
        r = await self._router()
        ids = r.live_replicas() if r is not None else []

        async def one(rid):
            try:
                return await asyncio.wait_for(
                    self.engine.options(method_name="call").remote(
                        Forward("GET", path, headers=[LOOPBACK_HOST], target=rid)), TARGETED_TIMEOUT_S)
            except Exception as e:  # noqa: BLE001 - reported per replica
                return e
        # one at a time: calls made while serving one HTTP request share Ray's internal
        # request id, and concurrent ones could be matched to each other's replica
        return {i: await one(i) for i in ids}

    async def health(self):
        out = {}
        for rid, res in (await self._each("/health")).items():
            if isinstance(res, Exception):
                out[rid] = {"status": "unreachable", "error": f"{type(res).__name__}: {res}"[:300]}
            else:
                try:
                    out[rid] = json.loads(res[1])
                except ValueError:
                    out[rid] = {"status": f"http {res[0]}"}
        body, status = health_body(out, self.configured)
        return JSONResponse(body, status_code=status)

    async def metrics_page(self):
        pages = {rid: res[1].decode() for rid, res in (await self._each("/metrics")).items()
                 if not isinstance(res, Exception) and res[0] == 200}
        text = merge_pages(pages)
        r = router_for(self.engine_name)
        if r is not None:
            text += "# HELP freetoken_router_requests_total Requests routed, by the rule that placed them\n"
            text += "# TYPE freetoken_router_requests_total counter\n"
            for reason, n in sorted(r.routed.items()):
                text += f'freetoken_router_requests_total{{reason="{reason}"}} {n}\n'
            text += "# HELP freetoken_router_table_blocks Prompt blocks the router believes a replica holds\n"
            text += "# TYPE freetoken_router_table_blocks gauge\n"
            for rid in r.table.replicas():
                text += f'freetoken_router_table_blocks{{replica="{rid}"}} {r.table.size(rid)}\n'
        return Response(text, media_type="text/plain; version=0.0.4")

    # --- everything else: forwarded ---------------------------------------------------
    async def forward(self, request: Request):
        raw = await request.body()
        p = request.url.path
        key = None
        if request.method == "POST" and p in GENERATION_PATHS and self.tokenizer is not None:
            ids = await asyncio.to_thread(prompt_ids, self.tokenizer, p, raw)
            key = block_hashes(ids, self.block_size) if ids else None
        fwd = Forward(request.method, p, request.url.query.encode(),
                      [(k.encode("latin-1"), v.encode("latin-1")) for k, v in request.headers.items()],
                      raw, key=key, session=session_of(dict(request.headers), raw))
        return await self._dispatch(fwd)

    def _on_meta(self, m: dict) -> None:
        r = router_for(self.engine_name)
        if r is None:
            return
        r.table.set_capacity(m["replica"], m.get("kv_blocks_total") or 0)
        r.table.evicted(m["replica"], m.get("evicted_blocks") or 0)
        if m.get("block_size"):
            self.block_size = m["block_size"]

    async def _dispatch(self, fwd: Forward):
        last = None
        for _ in range(ATTEMPTS):
            gen = self.engine.options(stream=True, method_name="handle").remote(fwd)
            replica = None
            try:
                async for item in gen:
                    if isinstance(item, tuple) and item[0] == HELLO:
                        replica = item[1]
                    elif isinstance(item, tuple) and item[0] == START:
                        return self._respond(fwd.path, gen, item[1], item[2] + [("x-freetoken-replica", replica or "")])
                    elif isinstance(item, tuple) and item[0] == META:
                        self._on_meta(item[1])
                last = RuntimeError("the replica closed the response before it started")
            except asyncio.CancelledError:
                gen.cancel()
                raise
            except Exception as e:  # noqa: BLE001 - the replica died or is gone: try another
                last = e
                log.warning("replica %s failed before answering %s %s: %s", replica, fwd.method,
                            fwd.path, e)
            fwd.avoid = replica
        self.metrics.http_errors.labels("503").inc()
        return error_response(APIError(f"no replica could answer: {type(last).__name__}: "
                                       f"{str(last)[:200]}", status=503), fwd.path)

    def _respond(self, path, gen, status, headers):
        sse_stream = any(k.lower() == "content-type" and "text/event-stream" in v for k, v in headers)
        hdrs = {k: v for k, v in headers if k.lower() not in ("content-length", "transfer-encoding")}

        async def body():
            try:
                async for item in gen:
                    if isinstance(item, (bytes, bytearray)):
                        yield item
                    elif isinstance(item, tuple) and item[0] == META:
                        self._on_meta(item[1])
            except asyncio.CancelledError:
                gen.cancel()               # the client left: the replica aborts the request
                raise
            except Exception as e:  # noqa: BLE001 - the replica died mid-response
                log.warning("replica failed mid-response on %s: %s", path, e)
                self.metrics.http_errors.labels("503").inc()
                if sse_stream:
                    yield stream_error_event(path, f"the replica serving this request failed: "
                                                   f"{type(e).__name__}").encode()
            finally:
                gen.cancel()
        media = dict((k.lower(), v) for k, v in headers).get("content-type")
        return StreamingResponse(body(), status_code=status, headers=hdrs, media_type=media)

