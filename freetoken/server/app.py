"""The FastAPI application: routes of both adapters, API key, protocol-shaped errors,
health and metrics. The engine thread starts and stops with the app's lifespan."""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from .api import anthropic as anthropic_api, openai as openai_api, responses as openai_responses, tokenize as tokenize_api
from . import web_ui
from .errors import APIError, BadRequest, NotFound, Unauthorized, error_response
from .generation import GenerationService
from .operations.memory_trim import TrimAfterLargeBodies
from .guards.request_guard import RequestGuard
from .guards.request_limits import ClientGone
from .server_state import AppState, ServerSettings
from ..experts.measure.stats import tier_summary
from .operations.admin import make_router

CURRENT_SIZES_TIMEOUT_S = 30.0    # GET /v1/memory waits at most this for the step in flight

log = logging.getLogger("freetoken.server")

OPEN_PATHS = {"/health", "/api/hello"}
ADMIN = "/admin/"            # admin routes check their own token (server/operations/admin.py)


def needs_api_key(path: str) -> bool:
    """Everything but the probes, the admin routes (their own token) and the web page's files."""
    return path not in OPEN_PATHS and not path.startswith(ADMIN) and not web_ui.is_page_path(path)


def _key_from(request: Request) -> str | None:
    key = request.headers.get("x-api-key") or request.headers.get("api-key")
    if key:
        return key
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return None


class APIKeyMiddleware:
    """Plain ASGI (so streaming and disconnects pass straight through)."""

    def __init__(self, app, key: str, metrics):
        self.app, self.key, self.metrics = app, key.encode(), metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and needs_api_key(scope["path"]):
            key = _key_from(Request(scope))
            if key is None or not hmac.compare_digest(key.encode(), self.key):
                self.metrics.http_errors.labels("401").inc()
                resp = error_response(Unauthorized(
                    "invalid or missing API key: send it as 'Authorization: Bearer KEY' or "
                    "'x-api-key: KEY'"), scope["path"])
                return await resp(scope, receive, send)
        return await self.app(scope, receive, send)


def create_app(svc: GenerationService, settings: ServerSettings, *, manage_engine: bool = True) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if manage_engine:
            svc.start()
        try:
            yield
        finally:
            if manage_engine:
                svc.stop()

    app = FastAPI(title="FreeToken", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.freetoken = AppState(svc, settings)

    if settings.api_key:
        app.add_middleware(APIKeyMiddleware, key=settings.api_key, metrics=svc.metrics)
    app.add_middleware(TrimAfterLargeBodies)
    # added last = runs first: Host/Origin/Content-Type before the key, CORS outermost
    app.add_middleware(RequestGuard, allowed_hosts=settings.allowed_hosts,
                       cors_origins=settings.cors_origins, metrics=svc.metrics)
    if settings.cors_origins:
        from starlette.middleware.cors import CORSMiddleware
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins,
                           allow_methods=["GET", "POST", "HEAD"], allow_headers=["*"])

    _add_error_handlers(app, svc)
    _add_status_routes(app, svc, settings)
    for r in (openai_api.router, openai_responses.router, anthropic_api.router, tokenize_api.router,
              web_ui.router):
        app.include_router(r)
    if settings.admin_token:
        app.include_router(make_router(settings.admin_token))
    return app


def _add_error_handlers(app: FastAPI, svc: GenerationService) -> None:
    """Every failure answers in the protocol's error shape, counted; 4xx logs leave out the request's text."""
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        svc.metrics.http_errors.labels(str(exc.status)).inc()
        if exc.status >= 500:
            log.error("%s %s -> %d %s", request.method, request.url.path, exc.status, exc.message)
        else:   # a 4xx message may quote the request's own text: the client gets it, the log does not
            log.info("%s %s -> %d %s%s", request.method, request.url.path, exc.status,
                     exc.code or type(exc).__name__, f" (param {exc.param})" if exc.param else "")
        return error_response(exc, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        err = exc.errors()[0] if exc.errors() else {}        # not its "input": that is the request's text
        loc = ".".join(str(x) for x in err.get("loc", ()))
        return await api_error(request, BadRequest(f"{loc}: {err.get('msg', 'invalid request')}", param=loc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 404:
            err = NotFound(f"no route {request.method} {request.url.path}")
        else:
            err = APIError(str(exc.detail), status=exc.status_code)
        return await api_error(request, err)

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone):
        # nobody is listening: no error counted, no traceback; 499 as nginx logs it
        svc.metrics.client_disconnects.inc()
        log.info("%s %s: %s", request.method, request.url.path, exc)
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        log.exception("%s %s failed", request.method, request.url.path)
        return await api_error(request, APIError(f"internal error: {type(exc).__name__}: {exc}",
                                                 status=500))


def _add_status_routes(app: FastAPI, svc: GenerationService, settings: ServerSettings) -> None:
    """/health (and HEAD), /api/hello, /v1/memory, /metrics."""
    async def health():
        loop = svc.loop
        body = {"status": "ok", "model": settings.model_names[0], "running": loop.n_running,
                "waiting": loop.n_waiting}
        kv = svc.engine.kv_usage()
        if kv is not None:
            body["kv_blocks_in_use"], body["kv_blocks_total"] = kv.in_use, kv.usable
        if not loop.thread.is_alive():
            body["status"] = "engine stopped"
        elif loop.stopping.is_set() or loop.draining.is_set():
            body["status"] = "shutting down"
        elif loop.failures:
            body["status"] = "degraded"
            body["error"] = f"the last {loop.failures} engine step(s) failed: {loop.last_error}"
        disk = tier_summary(svc.metrics.engine_stats).get("disk") or {}
        if disk.get("integrity", "ok") not in ("ok", "not verified"):   # the snapshot may be stale when idle
            with contextlib.suppress(Exception):
                disk = tier_summary(svc.engine.expert_stats()).get("disk") or {}
        if body["status"] == "ok" and disk.get("integrity", "ok") not in ("ok", "not verified"):
            body["status"] = "degraded"       # the disk tier's model file changed (experts/disk/integrity.py)
            body["error"] = f"disk tier: the model file changed ({disk.get('integrity_detail', '')})"
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    @app.get("/v1/memory")
    async def memory():
        """The memory plan the engine was started with (see freetoken/memory/plan.py), under
        "current" the sizes now, after any runtime resize (read between two steps), and under
        "tiers" each expert tier's size, hit rate and disk reads (experts/measure/stats.py)."""
        plan = svc.engine.memory_plan
        if plan is None:
            raise NotFound("this engine has no memory plan")
        body = plan.to_json()
        body["pinned_bytes_now"] = svc.engine.pinned_bytes()
        body["tiers"] = tier_summary(svc.metrics.engine_stats)    # the engine thread's latest snapshot
        try:
            now = await asyncio.wait_for(asyncio.wrap_future(svc.loop.memory(None)), CURRENT_SIZES_TIMEOUT_S)
            body["current"] = now["sizes"]
        except Exception as e:  # noqa: BLE001 - the plan is still worth answering
            body["current"], body["current_error"] = None, str(e) or type(e).__name__
        return JSONResponse(body)

    async def hello():
        return Response(status_code=200)

    for path, fn in (("/health", health), ("/api/hello", hello)):
        app.add_api_route(path, fn, methods=["GET"])
        app.add_api_route(path, fn, methods=["HEAD"], operation_id=f"{fn.__name__}_head")

    @app.get("/metrics")
    async def metrics():
        return Response(svc.metrics.render(), media_type="text/plain; version=0.0.4")
