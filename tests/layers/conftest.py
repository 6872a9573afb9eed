"""The layer tests run the C kernels' exact dot tiles and fp32 attention unless a test switches a
path on: the decode GEMV's and decode attention's AMX switches are process-wide in the library,
and a model built earlier in the same process (auto on an AMX machine) leaves them on."""
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
