"""The disk tier's GIL-free xxh3-64 (experts/disk/hash_nogil.py) gives python-xxhash's digests
for any split of the bytes into updates, over the buffer kinds the reader hashes (a slot's
tensor rows, a bytearray, read-only bytes), so the checksums kept on disk stay valid."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import xxhash
from hypothesis import HealthCheck, given, settings, strategies as st

from freetoken.experts.disk import hash_nogil


@pytest.fixture(params=hash_nogil.UPDATES or [None])
def update(request):
    """Each of the library's update functions this build exports (SIMD dispatch, SSE2)."""
    if request.param is None:
        yield None
        return
    was = hash_nogil._update
    hash_nogil._update = getattr(hash_nogil._LIB, request.param)
    yield request.param
    hash_nogil._update = was


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=5000), st.lists(st.integers(0, 5000), max_size=6), st.sampled_from(["bytearray", "tensor", "bytes"]))
def test_digests_equal_python_xxhash(update, data, cuts, kind):
    if kind == "tensor":
        buf = memoryview(torch.frombuffer(bytearray(data), dtype=torch.uint8).numpy()).cast("B") if data else memoryview(b"")
    else:
        buf = memoryview(bytearray(data) if kind == "bytearray" else data)
    edges = [0, *sorted(min(c, len(data)) for c in cuts), len(data)]
    ours, ref = hash_nogil.xxh3_64(), xxhash.xxh3_64()
    for a, b in zip(edges, edges[1:]):
        ours.update(buf[a:b])
        ref.update(data[a:b])
    assert ours.intdigest() == ref.intdigest() == xxhash.xxh3_64_intdigest(data)


def test_an_expert_sized_buffer_and_the_library_is_used(update):
    """Large (several MiB, the xxh3 long-input path) and through ctypes on this build, with
    the SIMD dispatch first where exported."""
    data = np.random.default_rng(0).integers(0, 256, 3 << 20, dtype=np.uint8)
    h = hash_nogil.xxh3_64()
    h.update(memoryview(data)[:12345])
    h.update(memoryview(data)[12345:])
    assert h.intdigest() == xxhash.xxh3_64_intdigest(data.tobytes())
    assert hash_nogil._LIB is not None, "python-xxhash no longer exports XXH3_*: the GIL is held again"
    assert hash_nogil.UPDATES[0] == ("XXH3_64bits_update_dispatch" if hasattr(hash_nogil._LIB, "XXH3_64bits_update_dispatch")
                                     else "XXH3_64bits_update")
