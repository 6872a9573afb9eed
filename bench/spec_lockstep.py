"""Plain vs speculative decoding in lockstep on one engine (bench/speculative.py --lockstep):
the never-slower target read at the per-window level, as bench/disk_hits.py reads the disk tier.

Two requests of the same prompt live in one engine; only one of them is in the scheduler's
running list at a time (the other is parked aside with its KV blocks), and the engine's
speculator is attached for the speculative side's steps only. The two sides step in turn (which
goes first alternates step by step), each step timed on its own, so a neighbour's burst or the
machine's drift between rounds moves both sides alike. A window of W step pairs gives one ratio,
(speculative tokens / seconds) / (plain tokens / seconds): a window, not a step, so the rare
dear verify of a rejected draft counts in its window's ratio (the median of single steps would
hide it). The figure is the median of the window ratios over every prompt and round; the
control runs the same lockstep with two plain sides: the method's own spread on this machine
at this load (1.000x when it has none). Greedy output must be identical on both sides (checked).
`clock`: what a step's seconds are read from: `time.perf_counter` (wall), or `time.process_time`
(the process's CPU seconds: on one thread, the seconds the step computed, not the seconds it
waited for a core the machine's other programs held)."""
from __future__ import annotations

import statistics
import time


CLOCKS = {"wall": time.perf_counter, "process": time.process_time}


def _side_step(engine, seq, spec, clock=time.perf_counter) -> tuple[float, int, bool]:
    """One engine step of `seq` alone (the other side parked): (seconds, new tokens, finished)."""
    sched = engine.scheduler
    sched.running[:] = [seq]
    engine.spec = spec
    n, done = 0, False
    t0 = clock()
    for out in engine.step():
        n += len(out.new_token_ids)
        done |= out.finished
    return clock() - t0, n, done


def lockstep(engine, sides: dict, prompt: list[int], params_of, tag: str, tail: bool = False,
             clock=time.perf_counter, probe=None):
    """sides: name -> speculator or None (plain). Each side's request is prefilled alone (untimed),
    then the sides decode step by step in turn until the first finishes; the rest runs untimed
    (tail: timed too, the replay's turns, where the speculative side ends steps earlier).
    Returns ({name: [(seconds, tokens)] per decode step}, {name: output ids}); with `probe`
    (name -> value, read after each step), the steps are (seconds, tokens, value)."""
    seqs, done = {}, {}
    for name, spec in sides.items():
        parked = list(engine.scheduler.running)
        engine.scheduler.running[:] = []
        engine.spec = spec
        rid = f"{tag}-{name}-{time.monotonic_ns()}"
        engine.add_request(rid, prompt, params_of())
        seqs[name] = seq = engine.seqs[rid]
        while not seq.output_ids:                        # the prefill, up to the first token
            engine.step()
        done[name] = False
        engine.scheduler.running[:] = parked + [seq]
    steps = {name: [] for name in sides}
    i = 0
    while not any(done.values()):
        order = list(sides) if i % 2 == 0 else list(sides)[::-1]
        for name in order:
            if done[name]:
                continue
            dt, n, done[name] = _side_step(engine, seqs[name], sides[name], clock)
            steps[name].append((dt, n) if probe is None else (dt, n, probe(name)))
        i += 1
    for name in sides:                     # the rest, for the identity check
        while not done[name]:
            dt, n, done[name] = _side_step(engine, seqs[name], sides[name], clock)
            if tail:
                steps[name].append((dt, n) if probe is None else (dt, n, probe(name)))
    engine.scheduler.running[:] = []
    return steps, {name: list(seqs[name].output_ids) for name in sides}


def window_ratios(a: list, b: list, window: int) -> list[float]:
    """Per window of `window` step pairs: (b tokens / b seconds) / (a tokens / a seconds)."""
    out = []
    for w in range(0, min(len(a), len(b)) - window + 1, window):
        ta = sum(s[0] for s in a[w:w + window])
        tb = sum(s[0] for s in b[w:w + window])
        na = sum(s[1] for s in a[w:w + window])
        nb = sum(s[1] for s in b[w:w + window])
        out.append((nb / tb) / (na / ta))
    return out


def rate(steps: list) -> float:
    """Tokens a second over (seconds, tokens[, ...]) steps."""
    return sum(s[1] for s in steps) / sum(s[0] for s in steps)


def summary(ratios: list[float]) -> str:
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return f"{statistics.median(ratios):.3f}x (median of {len(ratios)} windows, quartiles {q[0]:.3f}-{q[2]:.3f})"
