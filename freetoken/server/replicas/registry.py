"""The routers living in this process, by deployment name, for the front end to read.

Its own module because Ray pickles the router's module by value (a copy of its globals),
while this one is imported by reference: router and front end see the same dict."""
from __future__ import annotations

import threading

_ROUTERS: dict = {}
_LOCK = threading.Lock()


def register(deployment: str, router) -> None:
    with _LOCK:
        _ROUTERS[deployment] = router


def router_for(deployment: str):
    with _LOCK:
        return _ROUTERS.get(deployment)
