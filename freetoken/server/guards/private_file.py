"""Files that hold an API key (agent configs written by `freetoken launch` and its probe)."""
from __future__ import annotations

import os
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    """Write a file that holds the API key: readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)          # an older file keeps its mode through O_TRUNC
    with os.fdopen(fd, "w") as f:
        f.write(text)
