"""No drive-by web pages: a page the user opens can send requests to a server on loopback
(a `text/plain` POST needs no CORS preflight) and, by DNS rebinding (its own name resolved to
127.0.0.1), read the replies. So, before any route:
- Host must be a loopback name, an IP literal (a rebinding page's Host is its own DNS name),
  or one of `--allowed-hosts` ("*" allows all);
- Origin, when a browser sends one, must be this server itself or one of `--cors-origins`;
- POST bodies must say `application/json` (415 otherwise), which a page cannot send without
  a preflight that CORS (off unless `--cors-origins`) refuses.
/health and /api/hello stay open for probes (they carry no reply text)."""
from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from ..operations.admin import PREFIX as ADMIN_PREFIX
from ..errors import APIError, error_response

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}
OPEN_PATHS = {"/health", "/api/hello"}


def host_name(value: str) -> str:
    """The host of a Host header or an origin's netloc, lower-case, without port or brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


class Forbidden(APIError):
    status = 403


class UnsupportedMediaType(APIError):
    status = 415


class RequestGuard:
    """Plain ASGI middleware (streams and disconnects pass straight through)."""

    def __init__(self, app, allowed_hosts: list[str] | None, cors_origins: list[str], metrics):
        self.app, self.metrics = app, metrics
        hosts = [h.strip().lower() for h in allowed_hosts or [] if h.strip()]
        self.any_host = "*" in hosts
        self.hosts = LOOPBACK_NAMES | {host_name(h) for h in hosts}
        self.origins = {o.strip().rstrip("/").lower() for o in cors_origins if o.strip()}

    def host_allowed(self, host: str) -> bool:
        name = host_name(host)
        return self.any_host or name in self.hosts or _is_ip(name) or name.endswith(".localhost")

    def origin_allowed(self, origin: str, host: str) -> bool:
        origin = origin.strip().rstrip("/").lower()
        if "*" in self.origins or origin in self.origins:
            return True
        parts = urlsplit(origin)         # the server's own pages (none today) are same-origin
        return bool(parts.netloc) and parts.netloc == host.strip().lower()

    def refusal(self, scope) -> APIError | None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        if not self.host_allowed(host):
            return Forbidden(f"Host {host_name(host)!r} is not allowed: this server answers loopback "
                             "names and IP addresses (serve --allowed-hosts NAME to add one)")
        origin = headers.get("origin")        # "null" (a sandboxed page) only if listed
        if origin is not None and not self.origin_allowed(origin, host):
            return Forbidden(f"Origin {origin[:100]!r} is not allowed (serve --cors-origins to "
                             "allow a web page to call this server)")
        # /admin/ routes take any content type (curl -d sends a form type): they need the
        # admin token in a header, which a cross-site form post cannot send, so the JSON-only
        # rule (a CSRF guard for the unauthenticated routes) has nothing to add there
        if scope["method"] == "POST" and not scope["path"].startswith(ADMIN_PREFIX):
            ctype = headers.get("content-type", "").split(";")[0].strip().lower()
            if ctype != "application/json" and not (ctype.startswith("application/") and ctype.endswith("+json")):
                return UnsupportedMediaType(f"Content-Type {ctype or '(none)'!r}: JSON routes need "
                                            "'Content-Type: application/json'")
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            err = self.refusal(scope)
            if err is not None:
                self.metrics.http_errors.labels(str(err.status)).inc()
                return await error_response(err, scope["path"])(scope, receive, send)
        return await self.app(scope, receive, send)
