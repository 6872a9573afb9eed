"""`GET/POST /admin/memory`: read and resize the engine's memory at runtime. Off unless the
server was started with an admin token (`serve --admin-token`); the token travels as
`x-admin-token: TOKEN` or `Authorization: Bearer TOKEN` and is compared in constant time.
Admin routes check their own token, not the API key."""
from __future__ import annotations

import asyncio
import hmac

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ...errors import FreeTokenError
from ..errors import BadRequest, Unauthorized
from ..guards.request_limits import parse_json, read_body
from ..server_state import state

PREFIX = "/admin/"
SIZES = ("expert_cache_gib", "kv_cache_gib", "state_cache_gib", "host_cache_gib")
TIMEOUT_S = 120.0            # a resize waits for the step in flight (a long prefill) to end


def _token(request: Request) -> str:
    tok = request.headers.get("x-admin-token")
    if tok:
        return tok
    auth = request.headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else ""


def _authorize(request: Request, admin_token: str) -> None:
    if not hmac.compare_digest(_token(request).encode(), admin_token.encode()):
        raise Unauthorized("invalid or missing admin token: send it as 'x-admin-token: TOKEN' or "
                           "'Authorization: Bearer TOKEN'")


def _resize_args(body: object) -> dict:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    unknown = sorted(set(body) - set(SIZES) - {"allow_preempt"})
    if unknown:
        raise BadRequest(f"unknown field(s) {unknown}; expected some of {list(SIZES) + ['allow_preempt']}",
                         param=unknown[0])
    if not any(body.get(k) is not None for k in SIZES):
        raise BadRequest(f"nothing to resize: give at least one of {list(SIZES)} (GiB)")
    if not isinstance(body.get("allow_preempt", True), bool):
        raise BadRequest("allow_preempt: expected true or false", param="allow_preempt")
    return {k: v for k, v in body.items() if v is not None}


def make_router(admin_token: str) -> APIRouter:
    router = APIRouter()

    async def run(request: Request, resize: dict | None) -> JSONResponse:
        loop = state(request).svc.loop
        try:
            result = await asyncio.wait_for(asyncio.wrap_future(loop.memory(resize)), TIMEOUT_S)
        except FreeTokenError as e:                   # a size the engine rejects
            raise BadRequest(str(e)) from None
        plan = state(request).svc.engine.memory_plan
        if plan is not None:
            result["planned"] = plan.options
        return JSONResponse(result)

    @router.get("/admin/memory")
    async def get_memory(request: Request):
        _authorize(request, admin_token)
        return await run(request, None)

    @router.post("/admin/memory")
    async def post_memory(request: Request):
        _authorize(request, admin_token)
        body = await asyncio.to_thread(parse_json, await read_body(request, state(request).settings.max_body_bytes))
        return await run(request, _resize_args(body))

    return router
