"""Progress of long reads and writes: a tqdm bar (bytes, rate, ETA) on stderr when it is a
terminal; otherwise one INFO log line per ~10% (bytes, rate, ETA) so a service log shows it."""
from __future__ import annotations

import logging
import threading
import time

from tqdm import tqdm

log = logging.getLogger("freetoken.weights")


class _Bar:
    """A thread-safe byte counter over a tqdm bar (readers update it from several threads)."""

    def __init__(self, total: int, desc: str):
        self._bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                         disable=None, leave=False, dynamic_ncols=True)
        self._lock = threading.Lock()
        self.total, self.desc, self.done = total, desc, 0
        self._t0, self._next = time.monotonic(), 0.1

    def update(self, n: int) -> None:
        with self._lock:
            self._bar.update(n)
            self.done += n
            if self._bar.disable and self.total and self.done >= self._next * self.total:
                self._log()
                while self._next * self.total <= self.done:
                    self._next += 0.1

    def _log(self) -> None:
        dt = max(time.monotonic() - self._t0, 1e-9)
        rate = self.done / dt
        eta = (self.total - self.done) / rate if rate else 0.0
        log.info("%s: %.0f%% (%.2f of %.2f GiB, %.0f MiB/s, ETA %.0f s)", self.desc,
                 100 * min(1.0, self.done / self.total), self.done / 2**30, self.total / 2**30, rate / 2**20, eta)

    def __enter__(self):
        return self

    def close(self) -> None:
        self._bar.close()

    def __exit__(self, *exc):
        self.close()


def progress(total: int, desc: str) -> _Bar:
    return _Bar(total, desc)
