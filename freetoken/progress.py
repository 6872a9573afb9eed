"""Progress of every long step (load, convert, checksum, download, calibration, profile), one
shape for all: a tqdm bar on stderr when it is a terminal; otherwise one INFO line on the
`freetoken.progress` logger per ~10% (done, rate, ETA); a step over within DELAY_S shows nothing so a service log shows it without a bar's
carriage returns; nothing at all under `--json` (`set_mode("off")`).

The mode comes from FREETOKEN_PROGRESS (auto | bar | log | off; `freetoken run` sets "bar" for
the server it starts on a terminal, whose stderr it relays), else "auto" (bar on a tty)."""
from __future__ import annotations

import logging
import os
import sys
import threading
import time

from tqdm import tqdm

log = logging.getLogger("freetoken.progress")
log.setLevel(logging.INFO)          # shown under the CLI's default WARNING root level
MODES = ("auto", "bar", "log", "off")
_mode: str | None = None
# a step done sooner says nothing: a small model's load must not bury a one-line error or a
# reply under ten progress lines (the bar and the first log line wait this long)
DELAY_S = 2.0


def set_mode(mode: str) -> None:
    """Process-wide: "off" under --json; "bar"/"log" force one; "auto" decides per bar."""
    global _mode
    if mode not in MODES:
        raise ValueError(f"progress mode {mode!r}: expected one of {', '.join(MODES)}")
    _mode = mode


def mode() -> str:
    m = _mode or os.environ.get("FREETOKEN_PROGRESS", "auto").strip().lower() or "auto"
    if m not in MODES:
        m = "auto"
    if m == "auto":
        m = "bar" if sys.stderr is not None and sys.stderr.isatty() else "log"
    return m


def _size(n: float, unit: str) -> str:
    if unit != "B":
        return f"{n:.0f}"
    for div, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= div:
            return f"{n / div:.2f} {name}"
    return f"{n:.0f} B"


class Progress:
    """A thread-safe counter over a bar or ~10% log lines (readers update it from several threads).
    `unit` "B" shows sizes and a byte rate; any other unit shows counts ("steps", "files")."""

    def __init__(self, total: int, desc: str, unit: str = "B", initial: int = 0):
        self.total, self.desc, self.unit, self.done = total, desc, unit, initial
        self.mode = mode()
        self._bar = None
        if self.mode == "bar":
            self._bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", unit_divisor=1024,
                             leave=False, dynamic_ncols=True, initial=initial, file=sys.stderr, delay=DELAY_S)
        self._lock = threading.Lock()
        self._t0, self._start = time.monotonic(), initial
        self._next = (int(10 * initial / total) + 1) / 10 if total else 1.0

    def update(self, n: int) -> None:
        with self._lock:
            self.done += n
            if self._bar is not None:
                self._bar.update(n)
            elif self.mode == "log" and self.total and self.done >= self._next * self.total:
                if time.monotonic() - self._t0 >= DELAY_S:
                    self._log()
                while self._next * self.total <= self.done:
                    self._next += 0.1

    def _log(self) -> None:
        dt = max(time.monotonic() - self._t0, 1e-9)
        rate = (self.done - self._start) / dt
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        per_s = f"{_size(rate, 'B')}/s" if self.unit == "B" else f"{rate:.1f} {self.unit}/s"
        log.info("%s: %.0f%% (%s of %s, %s, ETA %.0f s)", self.desc, 100 * min(1.0, self.done / self.total),
                 _size(self.done, self.unit), _size(self.total, self.unit), per_s, eta)

    def __enter__(self):
        return self

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __exit__(self, *exc):
        self.close()


def progress(total: int, desc: str, unit: str = "B", initial: int = 0) -> Progress:
    return Progress(total, desc, unit, initial)
