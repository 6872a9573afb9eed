"""The kernels' process-wide switches read and put back as one array (c/switches.c): what
tests/conftest.py restores after every test, so an engine's calibrated choices never reach a
later test's kernels."""
from __future__ import annotations

import pytest

from freetoken import kernels


@pytest.fixture
def lib():
    """The native library, its switches put back after the test whatever it asserted."""
    native = kernels.load("native")
    saved = kernels.switches()
    yield native
    kernels.set_switches(saved)


def test_switches_round_trip_every_setter(lib):
    saved = kernels.switches()
    lib.ft_set_bf16_dot(1)
    lib.ft_set_ggml_act(2)
    lib.ft_set_ggml_k256(1)
    lib.ft_set_ggml_tiles(0, 7)
    lib.ft_set_gemm(0, 5, 0)
    assert kernels.switches()["native"] != saved["native"]
    assert lib.ft_set_ggml_act(-1) == 2 and lib.ft_set_ggml_k256(-1) == 1
    kernels.set_switches(saved)
    assert kernels.switches() == saved
    assert lib.ft_set_ggml_act(-1) == saved["native"][7] and lib.ft_set_ggml_k256(-1) == saved["native"][9]


def test_a_library_with_nothing_saved_gets_its_values_at_load(lib):
    lib.ft_set_ggml_k256(1)
    lib.ft_set_bf16_dot(1)
    kernels.set_switches({})            # nothing saved for it: the values it was built with (all off)
    assert lib.ft_set_ggml_k256(-1) == 0 and kernels.switches()["native"][0] == 0
