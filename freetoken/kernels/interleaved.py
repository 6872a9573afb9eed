"""Timing kernel variants side by side for the calibrations (kernels/choices.py and the probes it
calls): each round runs every variant once, so a change of load on a shared machine hits them alike."""
from __future__ import annotations

import time
from typing import Callable


def best_interleaved(run: Callable[[], None], switch: Callable[[str], object], names: tuple[str, ...],
                     reps: int) -> dict:
    """{name: best seconds of `run` with `switch(name)` applied}, the names interleaved in each
    round so a change of load hits them alike; each timed run follows a warm-up run."""
    best = {}
    for _ in range(reps):
        for name in names:
            switch(name)
            run()
            t = time.perf_counter()
            run()
            best[name] = min(best.get(name, 1e9), time.perf_counter() - t)
    return best
