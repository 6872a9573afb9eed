"""The calibrations' timing under load (kernels/interleaved.py) and their pick from it
(kernels/choices.py's `_calibrated`): injected rounds, quiet, loaded, noisy, too close to call.
Issue 38: a bf16-dot calibration measured under other processes' load picked fp32 activations
and cached it for every later start."""
import json

import pytest
import torch
from hypothesis import given, settings, strategies as st

from freetoken.kernels import choices
from freetoken.kernels.interleaved import Timings, steady_seconds, timed_interleaved

CPU = torch.device("cpu")
ZEN4 = frozenset("avx2 fma f16c avx512f avx512bw avx512vl avx512dq avx512_vnni avx512_bf16".split())
# the quiet bf16-dot timings of the 2-core Zen 4 (2 threads, ms): vdpbf16ps 1.22x at 1 row, 1.75x at 9
QUIET = {"fp32-1": 2.88, "bf16-1": 2.36, "fp32-5": 5.54, "bf16-5": 3.60, "fp32-9": 9.12, "bf16-9": 5.19}


def _loaded(f: float) -> dict:
    """QUIET in a round that another process slowed as a whole by `f`."""
    return {k: v * f for k, v in QUIET.items()}


def _ratios(t: dict) -> dict:
    return {k: t[k] / t["fp32-1"] for k in t}


def test_one_round_is_returned_as_it_is():
    assert steady_seconds([dict(QUIET)]) == QUIET and steady_seconds([]) == {}
    assert Timings([dict(QUIET)]) == QUIET


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.05, 20.0), min_size=2, max_size=9))
def test_a_round_slowed_as_a_whole_moves_nothing(loads):
    """Another process's load that slows a round, any round by any factor: the ratios stay."""
    got = steady_seconds([_loaded(f) for f in loads])
    assert _ratios(got) == pytest.approx(_ratios(QUIET), rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(st.integers(3, 8), st.data())
def test_outliers_in_a_minority_of_rounds_move_nothing(clean, data):
    """Rounds that another process hit on one variant only (any variants, up to 50x) change no
    ratio while the undisturbed rounds (each slowed as a whole by any factor) outnumber them by 2."""
    bad = data.draw(st.integers(0, clean - 2))
    rounds = [_loaded(data.draw(st.floats(0.5, 10.0))) for _ in range(clean)]
    for _ in range(bad):
        r = _loaded(data.draw(st.floats(0.5, 10.0)))
        for k in data.draw(st.lists(st.sampled_from(sorted(QUIET)), min_size=1, unique=True)):
            r[k] *= data.draw(st.floats(1.0, 50.0))
        rounds.insert(data.draw(st.integers(0, len(rounds))), r)
    assert _ratios(steady_seconds(rounds)) == pytest.approx(_ratios(QUIET), rel=1e-9)


def test_rounds_interleave_the_variants_each_timed_after_a_warm_up():
    """A fake clock that each run advances by the variant's cost: every variant in every round,
    no variant always first, a warm-up run before each timed one, its cost read on the clock given."""
    cost, now, log = {"a": 2.0, "b": 3.0}, {"t": 0.0, "way": None}, []

    def run():
        log.append(now["way"])
        now["t"] += cost[now["way"]]
    t = timed_interleaved(run, lambda name: now.update(way=name), ("a", "b"), 3, clock=lambda: now["t"])
    assert log == ["a", "a", "b", "b", "b", "b", "a", "a", "a", "a", "b", "b"]    # every other round reversed
    assert t == cost and t.rounds == [cost] * 3


class Rounds:
    """A calibration that returns the next of `batches` (lists of rounds) per call."""
    def __init__(self, *batches):
        self.batches, self.calls = list(batches), 0

    def __call__(self, threads):
        self.calls += 1
        rounds = self.batches[min(self.calls, len(self.batches)) - 1]
        return Timings([dict(r, fp32=choices.dot_mix_seconds(r, "fp32"), bf16=choices.dot_mix_seconds(r, "bf16"))
                        for r in rounds])


def _dot(measure, cache=None):
    return choices.bf16_dot_choice("auto", torch.bfloat16, kernels=True, flags=ZEN4, threads=2, measure=measure,
                                   cache=cache)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_the_bf16_dot_pick_under_load_is_the_quiet_pick(data):
    """Five rounds, each slowed by any load and with up to one variant of one round hit 1-20x
    (what a descheduled pool thread does to the wall time): vdpbf16ps, as quiet."""
    rounds = [_loaded(data.draw(st.floats(0.5, 10.0))) for _ in range(5)]
    r = data.draw(st.integers(0, 4))
    rounds[r][data.draw(st.sampled_from(sorted(QUIET)))] *= data.draw(st.floats(1.0, 20.0))
    on, t = _dot(Rounds(rounds))
    assert on and t.sure


def test_too_close_to_call_keeps_the_default_and_a_later_start_measures_again(tmp_path):
    """Halves of the rounds that pick differently: as many rounds again; still split, the default
    (fp32 activations) is kept and cached as unsure; each later start measures again, RETRIES
    starts in all, then the default sticks unmeasured. A sure measurement is kept for good."""
    on_1row = dict(QUIET, **{"bf16-1": 2.80})                   # vdpbf16ps within the 1-row margin
    off_1row = dict(QUIET, **{"bf16-1": 3.00})                  # 1.04x slower at 1 row: off
    split = [on_1row, off_1row] * 3
    cal = Rounds(split)
    for start in range(1, choices.RETRIES + 2):
        on, t = _dot(cal, tmp_path)
        assert not on and not t.sure
        assert cal.calls == 2 * min(start, choices.RETRIES)     # each measuring start: two measurements
    entry = json.loads(next(tmp_path.iterdir()).read_text())
    assert entry["tries"] == choices.RETRIES and len(entry["rounds"]) == 12
    c = choices.cpu_choices(torch.bfloat16, CPU, "auto", kernels=True, flags=ZEN4, threads=2,
                            measure=lambda threads: {"fp32": 1.0, "bf16": 2.0}, measure_dot=Rounds(split))
    assert not c.bf16_dot and "too close to call, the default kept" in c.describe()

    quiet_later = Rounds(split, [QUIET] * 5)        # split at the first start, sure at the second
    fresh = tmp_path / "later"
    assert _dot(quiet_later, fresh)[0] is False and quiet_later.calls == 2
    assert _dot(quiet_later, fresh)[0] is True and quiet_later.calls == 3
    assert _dot(quiet_later, fresh)[0] is True and quiet_later.calls == 3     # cached, sure


def test_a_split_first_measurement_settled_by_the_second(tmp_path):
    cal = Rounds([dict(QUIET, **{"bf16-1": 2.80}), dict(QUIET, **{"bf16-1": 3.00})], [QUIET] * 4)
    on, t = _dot(cal, tmp_path)
    assert on and t.sure and cal.calls == 2 and len(t.rounds) == 6


def test_an_entry_of_the_earlier_format_is_measured_again(tmp_path):
    """The best-wall-time entries cached before (a flat {name: seconds}) may hold a pick flipped
    by load: measured again once, in the new format."""
    cal = Rounds([QUIET] * 5)
    _dot(cal, tmp_path)
    path = next(tmp_path.iterdir())
    path.write_text(json.dumps(dict(QUIET, **{"bf16-1": 9.0, "fp32": 1.0, "bf16": 2.0})))
    assert _dot(cal, tmp_path)[0] is True and cal.calls == 2
    assert "rounds" in json.loads(path.read_text())


def test_a_thin_margin_between_two_ways_that_both_beat_the_default_is_not_the_default():
    """The prefill GEMM: torch's bf16 and the vdpbf16ps tiles within noise of each other, both
    1.3x fp32: the halves differ, yet neither picks the default (fp32 + the experts' dot
    products), so the whole rounds' pick stands and no later start measures again."""
    def rounds(first, second):
        return {"fp32": 1.3, "bf16": first, "vdpbf16ps": second, "dots_expert": 1.0, "vdpbf16ps_expert": 0.5}
    t = Timings([rounds(1.0, 1.01), rounds(1.01, 1.0)] * 2 + [rounds(1.0, 1.01)])
    dense, expert, got = choices.prefill_gemm_choice("auto", torch.float32, kernels=True, flags=ZEN4, threads=2,
                                                     measure=lambda threads: t)
    assert (dense, expert) == ("bfloat16", "vdpbf16ps") and got.sure


def test_a_calibration_measured_under_load_is_measured_again_at_a_quieter_start(tmp_path, monkeypatch):
    """The issue's case: the first start during a compile (load 3 per core) caches a pick; a later
    start at under half that load measures again and caches the new load; a start no quieter, or
    after one measured quiet (under 0.5 per core), reads the cache."""
    import os
    cores = len(os.sched_getaffinity(0))
    load = {"now": 3.0}
    monkeypatch.setattr(os, "getloadavg", lambda: (load["now"] * cores, 0.0, 0.0))
    cal = Rounds([QUIET] * 5)
    for now, calls in ((3.0, 1), (2.0, 1), (1.4, 2), (1.0, 2), (0.4, 3), (0.1, 3), (0.0, 3)):
        load["now"] = now
        assert _dot(cal, tmp_path)[0] is True and cal.calls == calls
    assert json.loads(next(tmp_path.iterdir()).read_text())["load"] == pytest.approx(0.4)


def test_the_gemm_calibration_interleaves_its_ways_on_the_library_here():
    from freetoken.kernels import cpu_kernels
    from freetoken.kernels.gemm import modes_here
    lib = cpu_kernels()
    t = choices.measure_gemm(1, m=16, n=64, k=128, reps=2, expert=(8, 64, 128))
    tiles = {m for m in modes_here(lib) if m != "plain"} if lib is not None else set()
    ways = {"fp32", "bf16"} | tiles | ({"dots_expert"} | {f"{m}_expert" for m in tiles} if tiles else set())
    assert set(t) == ways and len(t.rounds) == 2 and all(v >= 0 for v in t.values())
