"""What the server's logs may not hold: query strings (a client may put `?api_key=` there),
keys, prompt or generated text. Our own log lines name methods, paths, ids and counts only;
this filter cuts the query string out of uvicorn's access log (`--log-level debug`), whose
record arguments are (client, method, path with query, HTTP version, status)."""
from __future__ import annotations

import logging

ACCESS_LOGGER = "uvicorn.access"


class DropQueryString(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (*args[:2], args[2].split("?", 1)[0] + "?[query removed]", *args[3:])
        return True


def install() -> None:
    """Once per process (uvicorn configures its loggers when a Config is made: call after)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(f, DropQueryString) for f in logger.filters):
        logger.addFilter(DropQueryString())
