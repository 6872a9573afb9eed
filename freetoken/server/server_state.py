"""What every route shares: the app's state, body parsing, model-name policy, and
collecting a generation for non-streaming replies (cancelled if the client leaves)."""
from __future__ import annotations

import asyncio
import datetime as dt
import time
from dataclasses import dataclass, field

from fastapi import Request
from pydantic import BaseModel, ValidationError

from .errors import APIError, BadRequest, NotFound
from .events import Done, ReasoningDelta, TextDelta, ToolCallEnd, ToolCallStart
from .generation import Generation, GenerationService
from .guards.request_limits import ClientGone, parse_json, read_body


@dataclass
class ServerSettings:
    model_names: list[str]
    api_key: str | None = None
    model_match: str = "auto"        # auto: OpenAI routes strict, Anthropic routes map any id
    max_body_bytes: int = 32 << 20
    admin_token: str | None = None   # enables /admin/memory (server/operations/admin.py)
    allowed_hosts: list[str] = field(default_factory=list)   # beyond loopback names and IPs
    cors_origins: list[str] = field(default_factory=list)    # CORS off when empty
    random_demo: bool = False        # the random-weight demo model: the page shows a banner


@dataclass
class AppState:
    svc: GenerationService
    settings: ServerSettings
    started: float = field(default_factory=time.time)

    @property
    def started_iso(self) -> str:
        return dt.datetime.fromtimestamp(self.started, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    def check_model(self, model: str, anthropic: bool) -> None:
        if model in self.settings.model_names:
            return
        policy = self.settings.model_match
        if policy == "any" or (policy == "auto" and anthropic):
            return
        raise NotFound(f"The model '{model}' does not exist; this server serves "
                       f"{', '.join(repr(n) for n in self.settings.model_names)}",
                       code="model_not_found", param="model")


def json_body(model: type[BaseModel]) -> dict:
    """The route's request body in its OpenAPI operation (routes read the body themselves,
    to bound and check it first), so schema-driven fuzzers and clients see its fields."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": model.model_json_schema()}}}}


def state(request: Request) -> AppState:
    return request.app.state.freetoken


async def parse_body(request: Request, model: type[BaseModel]):
    raw = await read_body(request, state(request).settings.max_body_bytes)
    # parsing and validation hold the GIL: in a worker thread, after the counts are bounded
    return await asyncio.to_thread(validate_body, raw, model)


NUMBER_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
                 "frequency_penalty", "repetition_penalty", "max_tokens", "max_completion_tokens",
                 "max_output_tokens", "n")


def validate_body(raw: bytes, model: type[BaseModel]):
    """Bounded parse, unknown top-level fields dropped (they are accepted and ignored, so
    they need not be validated or kept), then the route's model."""
    obj = parse_json(raw)
    if not isinstance(obj, dict):
        raise BadRequest("the request body must be a JSON object")
    known = model.model_fields
    obj = {k: v for k, v in obj.items() if k in known}
    for k in NUMBER_FIELDS:            # pydantic would read true as 1.0
        if isinstance(obj.get(k), bool):
            raise BadRequest(f"{k}: expected a number, got {str(obj[k]).lower()}", param=k)
    if obj.get("logit_bias"):
        raise BadRequest("logit_bias is not supported by this server", param="logit_bias")
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise BadRequest(f"{loc}: {err['msg']}" + (f" (and {len(e.errors()) - 1} more errors)"
                                                   if len(e.errors()) > 1 else ""),
                         param=loc) from None


async def collect(gen: Generation):
    """Run a generation to the end: (text, reasoning, [(ToolCallStart, arguments)], Done)."""
    text, reasoning, calls, starts = [], [], [], {}
    done = None
    async for ev in gen.events():
        if isinstance(ev, TextDelta):
            text.append(ev.text)
        elif isinstance(ev, ReasoningDelta):
            reasoning.append(ev.text)
        elif isinstance(ev, ToolCallStart):
            starts[ev.index] = ev
        elif isinstance(ev, ToolCallEnd):
            calls.append((starts[ev.index], ev.arguments))
        elif isinstance(ev, Done):
            done = ev
    if done.finish_reason == "error":
        raise APIError(done.error or "generation failed", status=500)
    return "".join(text), "".join(reasoning), calls, done


async def with_keepalive(events, interval: float = 10.0):
    """Yield the events, and None whenever `interval` seconds pass without one (a long
    prefill), so the adapter can send a keep-alive."""
    it = events.__aiter__()
    nxt = None
    try:
        while True:
            if nxt is None:
                nxt = asyncio.ensure_future(it.__anext__())
            done, _ = await asyncio.wait({nxt}, timeout=interval)
            if not done:
                yield None
                continue
            try:
                ev = nxt.result()
            except StopAsyncIteration:
                return
            nxt = None
            yield ev
    finally:
        if nxt is not None:
            nxt.cancel()
            try:
                await nxt
            except BaseException:  # noqa: BLE001 - it was cancelled or finished
                pass
        await it.aclose()


async def until_disconnected(request: Request, gen: Generation, coro):
    """Await coro, but abort the generation if the client goes away first."""
    task = asyncio.ensure_future(coro)

    async def watch():
        while True:
            msg = await request.receive()
            if msg["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()      # its generation's cleanup aborts the request and counts it cancelled
        try:
            await task
        except (asyncio.CancelledError, Exception):
            pass
        gen.abort()
        raise ClientGone("client disconnected")
    return task.result()
