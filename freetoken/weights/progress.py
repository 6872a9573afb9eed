"""Progress bars for long reads and writes (tqdm on stderr; silent when stderr is not a terminal)."""
from __future__ import annotations

import threading

from tqdm import tqdm


class _Bar:
    """A thread-safe byte counter over a tqdm bar (readers update it from several threads)."""

    def __init__(self, total: int, desc: str):
        self._bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                         disable=None, leave=False, dynamic_ncols=True)
        self._lock = threading.Lock()

    def update(self, n: int) -> None:
        with self._lock:
            self._bar.update(n)

    def __enter__(self):
        return self

    def close(self) -> None:
        self._bar.close()

    def __exit__(self, *exc):
        self.close()


def progress(total: int, desc: str) -> _Bar:
    return _Bar(total, desc)
