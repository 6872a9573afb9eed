"""Hypothesis strategies for access streams: random, and adversarial shapes."""

from __future__ import annotations

from hypothesis import strategies as st

from freetoken.sim.access import stream_from_keys


@st.composite
def streams(draw, max_layers=3, max_experts=4, max_cells=14, max_segments=3):
    L = draw(st.integers(1, max_layers))
    E = draw(st.integers(1, max_experts))
    segments = []
    for _ in range(draw(st.integers(1, max_segments))):
        phase = draw(st.sampled_from(["prefill", "decode"]))
        cells = []
        for _ in range(draw(st.integers(0, max_cells))):
            layer = draw(st.integers(0, L - 1))
            experts = draw(st.sets(st.integers(0, E - 1), min_size=1, max_size=E))
            cells.append([layer * E + e for e in sorted(experts)])
        segments.append((phase, cells))
    return stream_from_keys(L, E, segments)


@st.composite
def layer_ordered_streams(draw, max_layers=4, max_experts=5, max_tokens=8):
    """Tokens passing through every layer in order (the shape decode has), so that a
    next-layer predictor has consecutive layers to learn from; an optional prompt first."""
    L = draw(st.integers(2, max_layers))
    E = draw(st.integers(2, max_experts))
    k = draw(st.integers(1, E))
    sets = st.sets(st.integers(0, E - 1), min_size=1, max_size=k)
    segments = []
    if draw(st.booleans()):
        segments.append(("prefill", [[l * E + e for e in sorted(draw(sets))] for l in range(L)]))
    tokens = draw(st.integers(1, max_tokens))
    segments.append(("decode", [[l * E + e for e in sorted(draw(sets))] for _ in range(tokens) for l in range(L)]))
    return stream_from_keys(L, E, segments)


def cyclic_stream(distinct: int, rounds: int, layers: int = 1):
    """Decode loop over ``distinct`` entries: LRU's worst case when slots < distinct."""
    E = -(-distinct // layers)
    keys = list(range(distinct))
    return stream_from_keys(layers, E, [("decode", [[k] for _ in range(rounds) for k in keys])])


def adversarial_streams():
    yield cyclic_stream(5, 6)
    yield cyclic_stream(8, 5, layers=2)
    yield stream_from_keys(1, 3, [("decode", [[0]] * 10)])
    yield stream_from_keys(2, 2, [("prefill", [[0, 1], [2, 3]]), ("decode", [[2, 3], [0], [2, 3], [1]] * 3)])
    yield stream_from_keys(2, 3, [("prefill", [[0, 1, 2]]), ("decode", [[3, 4, 5], [0, 1, 2]] * 3), ("prefill", [[3]]), ("decode", [[3], [4], [3]])])
    yield stream_from_keys(3, 2, [("decode", [[0, 1], [2, 3], [4, 5]] * 3 + [[0], [2], [4]] * 2)])
