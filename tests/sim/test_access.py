"""Replay semantics: prefill unions per layer, decode per cell, ascending ids; capacity parsing."""

import pytest

from freetoken.sim.access import build_stream
from freetoken.sim.capacity import parse_capacity
from freetoken.sim.trace import DECODE, PREFILL, Cell, Trace, with_prompt_tokens


def tiny_trace():
    cells = [
        Cell(0, PREFILL, 0, 0, ((3, 1),)), Cell(0, PREFILL, 0, 1, ((0, 2),)),
        Cell(0, PREFILL, 1, 0, ((1, 2),)), Cell(0, PREFILL, 1, 1, ((2, 3),)),
        Cell(0, DECODE, 2, 0, ((2, 0),)), Cell(0, DECODE, 2, 1, ((1, 3),)),
        Cell(0, DECODE, 3, 1, ((0, 3), (3, 1))),  # a batched decode step: union
    ]
    return Trace("t", "m", 2, 4, 2, cells)


def test_stream_follows_the_replay_semantics():
    s = build_stream(tiny_trace())
    prefill, decode = s.segments
    assert prefill.phase == PREFILL and prefill.cells == ((1, 2, 3), (4, 6, 7))
    assert prefill.prompt_counts == {1: 2, 3: 1, 2: 1, 4: 1, 6: 2, 7: 1}
    assert decode.phase == DECODE and decode.cells == ((0, 2), (5, 7), (4, 5, 7))
    assert decode.layers == (0, 1, 1)
    assert s.decode_accesses() == 7
    assert tiny_trace().decode_tokens() == 3  # step 2 decodes one token, batched step 3 two


def test_prompt_tokens_relabels_the_first_decode_steps():
    t = Trace("t", "m", 1, 4, 1, [Cell(0, DECODE, s, 0, ((s % 4,),)) for s in range(5)])
    p = with_prompt_tokens(t, 2)
    assert [c.phase for c in p.cells] == [PREFILL, PREFILL, DECODE, DECODE, DECODE]
    assert with_prompt_tokens(tiny_trace(), 5).cells == tiny_trace().cells  # has a prefill already


@pytest.mark.parametrize(
    "text, requested, slots",
    [("0.37", 0.37, 370), ("37%", 0.37, 370), ("512", 512, 512), ("0", 0, 0), ("0.0005", 0.0005, 1), ("1.0", 1.0, 1000)],
)
def test_capacity(text, requested, slots):
    c = parse_capacity(text, 1000)
    assert (c.requested, c.slots) == (requested, slots)


def test_capacity_rounds_half_up():
    assert parse_capacity("0.5", 5).slots == 3


@pytest.mark.parametrize("text", ["abc", "1.5", "-3", "-0.1"])
def test_bad_capacity(text):
    with pytest.raises(ValueError, match="capacity"):
        parse_capacity(text, 100)
