"""Timing kernel variants side by side for the calibrations (kernels/choices.py and the probes it
calls), steady under other processes' load on the same cores.

Each round runs every variant once, so a change of load hits them alike, on the wall clock. Each
variant's seconds are the median over rounds of its share of the round (its time over the round's
geometric mean), scaled by the median round: a round that another process slowed as a whole, or
one outlier, moves nothing. Measured on the 2-core Zen 4 under 2-4 spinning or memory-copying
processes (docs/benchmarks.md, issue 38): the best wall time of 5 rounds put the bf16-dot
calibration's 1-row ratio anywhere in 0.25-10.8x (quiet 1.1-1.3x) and flipped its pick in 3-4 of
10 calibrations. Not the process's CPU clock, tried first: it counts every thread of the
process (an engine's disk readers calibrating beside its kernels) and not a pool thread that
sleeps through a variant's serial part; on a quiet machine it put the k-quant calibration's
per-256 / per-32 ratio at 0.73-0.92 where the wall clock read 0.89-0.90, and inside the disk
tier's bench at 0.96-0.98 (too close to call: the slower way kept, the tier's decode 0.93x)."""
from __future__ import annotations

import math
import statistics
import time
from typing import Callable


class Timings(dict):
    """{name: steady seconds} of `rounds` (each {name: seconds}); `sure` is set by the choice that
    reads them (kernels/choices.py: False where the halves of the rounds pick differently)."""

    def __init__(self, rounds: list[dict]):
        super().__init__(steady_seconds(rounds))
        self.rounds, self.sure = rounds, True


def steady_seconds(rounds: list[dict]) -> dict:
    """{name: median over `rounds` of its time over the round's geometric mean, x the median of
    those means}; one round is returned as it is, no rounds as {}."""
    if len(rounds) <= 1:
        return dict(rounds[0]) if rounds else {}
    means = [math.exp(statistics.fmean(math.log(max(v, 1e-12)) for v in r.values())) for r in rounds]
    scale = statistics.median(means)
    return {name: scale * statistics.median(r[name] / m for r, m in zip(rounds, means)) for name in rounds[0]}


def timed_interleaved(run: Callable[[], None], switch: Callable[[str], object], names: tuple[str, ...],
                      reps: int, clock: Callable[[], float] = time.perf_counter) -> Timings:
    """Timings of `run` with `switch(name)` applied, `reps` rounds of the names interleaved (every
    other round in reverse order); each timed run follows a warm-up run, on `clock`."""
    rounds = []
    for i in range(reps):
        got = {}
        for name in (names if i % 2 == 0 else names[::-1]):     # no name always first or last
            switch(name)
            run()
            t = clock()
            run()
            got[name] = clock() - t
        rounds.append(got)
    return Timings(rounds)
