"""The layer tests run the C kernels' exact dot tiles and fp32 attention unless a test switches a
path on: the decode GEMV's and decode attention's AMX switches are globals of the library, off as
built (an engine's choices are its own, kernels/switch_set.py); set here so a layer test states
the path it starts from."""
from __future__ import annotations

import pytest

from freetoken import kernels


@pytest.fixture(autouse=True)
def gemv_dots():
    lib = kernels.load()
    if lib is not None:
        lib.ft_set_gemv_amx(0)
        lib.ft_set_att_amx(0)
    yield lib
