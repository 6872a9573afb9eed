"""The built-in web page: `GET /` (chat + live dashboard) and its static files under `/web/`,
plain files in `server/web/` (no build step, nothing from a CDN), and `GET /api/stats`, the
one piece of data the page needs that /metrics does not carry: the engine's statistics
snapshot whole (the very dict /metrics renders, with its per-(layer, expert) counters) and
the last finished requests. The page and its files are open (they hold no data; the page
asks for the API key and sends it as a Bearer token); /api/stats needs the key like every
data route."""
from __future__ import annotations

import time
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse

from .errors import NotFound
from .server_state import state

WEB_DIR = Path(__file__).with_name("web")
PAGE_PREFIX = "/web/"
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
# the page runs only its own files and talks only to this server; no framing (clickjacking)
HEADERS = {"Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
                                      "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; "
                                      "base-uri 'none'; form-action 'none'",
           "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-cache"}


def is_page_path(path: str) -> bool:
    """The page and its static files: served without the API key."""
    return path == "/" or path.startswith(PAGE_PREFIX)


def _file(name: str) -> FileResponse:
    files = {p.name: p for p in WEB_DIR.iterdir() if p.suffix in TYPES}   # by name: no traversal
    path = files.get(name)
    if path is None:
        raise NotFound(f"no file {name!r} in the web page")
    return FileResponse(path, media_type=TYPES[path.suffix], headers=HEADERS)


router = APIRouter()


@router.get("/", include_in_schema=False)
async def page():
    return _file("index.html")


@router.get(PAGE_PREFIX + "{name}", include_in_schema=False)
async def static(name: str):
    return _file(name)


@router.get("/api/stats")
async def stats(request: Request):
    st = state(request)
    svc, m = st.svc, st.svc.metrics
    return JSONResponse({
        "model": st.settings.model_names[0], "models": st.settings.model_names,
        "uptime_s": time.time() - st.started, "max_model_len": svc.max_model_len,
        "running": svc.loop.n_running, "waiting": svc.loop.n_waiting,
        "admin": bool(st.settings.admin_token), "random_demo": st.settings.random_demo,
        "engine": m.engine_stats,          # the snapshot /metrics exports as freetoken_engine_*
        "requests": list(m.recent),
    })
