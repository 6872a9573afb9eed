"""The kernels' switches as one value (c/switches.c read and written as one array, with the torch
executors' records: kernels/switch_set.py): taken and put back whole, installed for a block and
the caller's back after, nested, and one thread's block at a time."""
from __future__ import annotations

import threading

import pytest

from freetoken import kernels
from freetoken.kernels.switch_set import EXECUTOR_RECORDS, SwitchSet, loading


@pytest.fixture
def lib():
    """The native library, its switches put back after the test whatever it asserted."""
    native = kernels.load("native")
    saved = SwitchSet.now()
    yield native
    saved.put()


def set_some(lib) -> None:
    """One value of each kind of setter, none of them a library's as-built value."""
    lib.ft_set_bf16_dot(1)
    lib.ft_set_ggml_act(2)
    lib.ft_set_ggml_k256(1)
    lib.ft_set_int8_zmm(1)
    lib.ft_set_ggml_tiles(0, 7)
    lib.ft_set_gemm(0, 5, 0)
    EXECUTOR_RECORDS["bf16_dot"], EXECUTOR_RECORDS["tiles_min"] = True, 5


def test_switches_round_trip_every_setter(lib):
    saved = SwitchSet.now()
    set_some(lib)
    assert SwitchSet.now() != saved
    assert lib.ft_set_ggml_act(-1) == 2 and lib.ft_set_ggml_k256(-1) == 1
    saved.put()
    assert SwitchSet.now() == saved
    assert lib.ft_set_ggml_act(-1) == saved.arrays["native"][7] and lib.ft_set_ggml_k256(-1) == saved.arrays["native"][9]
    assert EXECUTOR_RECORDS == {"bf16_dot": saved.records[0], "tiles_min": saved.records[1]}


def test_a_library_with_nothing_saved_gets_its_values_as_built(lib):
    lib.ft_set_ggml_k256(1)
    lib.ft_set_bf16_dot(1)
    SwitchSet({}, (False, 0)).put()     # taken before any library was loaded: every one as built (all off)
    assert lib.ft_set_ggml_k256(-1) == 0 and SwitchSet.now().arrays["native"][0] == 0


def test_installed_puts_the_set_in_place_and_the_callers_back(lib):
    caller = SwitchSet.now()
    set_some(lib)
    engine = SwitchSet.now()
    caller.put()
    with engine.installed():
        assert SwitchSet.now() == engine and lib.ft_set_ggml_k256(-1) == 1
        with engine.installed():        # nested in its own values: still in place, not swapped out after
            assert SwitchSet.now() == engine
        assert SwitchSet.now() == engine
        with caller.installed():        # another set nested: in place, then this one's back
            assert SwitchSet.now() == caller and lib.ft_set_ggml_k256(-1) == caller.arrays["native"][9]
        assert SwitchSet.now() == engine
    assert SwitchSet.now() == caller


def test_a_block_that_raises_still_gives_the_callers_switches_back(lib):
    caller = SwitchSet.now()
    set_some(lib)
    engine = SwitchSet.now()
    caller.put()
    with pytest.raises(RuntimeError), engine.installed():
        raise RuntimeError("a step that fails")
    assert SwitchSet.now() == caller


def test_loading_gives_the_callers_switches_back(lib):
    caller = SwitchSet.now()
    with loading():
        set_some(lib)                   # what an engine's choices do while it loads
        assert SwitchSet.now() != caller
    assert SwitchSet.now() == caller


def test_another_threads_block_waits_for_this_one(lib):
    """Two engines stepping in two threads take turns: the second's install waits until the
    first's block ends, so neither computes with the other's switches."""
    caller = SwitchSet.now()
    set_some(lib)
    first = SwitchSet.now()
    caller.put()
    seen = []

    def other():
        with caller.installed():
            seen.append(SwitchSet.now())

    with first.installed():
        t = threading.Thread(target=other)
        t.start()
        t.join(0.2)
        assert t.is_alive() and not seen            # blocked while this block runs
        assert SwitchSet.now() == first
    t.join(10)
    assert seen == [caller] and SwitchSet.now() == caller
