"""Generated text holding a character that Python's str.splitlines reads as a line break
(NEL U+0085, LINE SEPARATOR U+2028, PARAGRAPH SEPARATOR U+2029) must not cut an SSE data
line: httpx's `aiter_lines` (and every client that splits a stream with splitlines) ended
the line there, left half a JSON object, and the soak counted a JSONDecodeError (issue 36:
a random tiny model says such characters about once in a thousand streams)."""
from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import given, settings, strategies as st

from fake_engine import FakeEngine
from live_server import LiveServer, make_fake

from freetoken.server.api import sse

SPLITLINES_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"   # str.splitlines, per the Python docs
TEXT = "a\u2028b\x85c\u2029d\x0be\x1cf\u00e9 \u2028\u2029\x85end"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(SPLITLINES_BREAKS) | st.characters(), max_size=40),
       st.sampled_from(["event", "data"]))
def test_a_frame_is_whole_lines_under_splitlines(text, kind):
    obj = {"delta": {"content": text}, "k": [text]}
    frame = sse.event("x", obj) if kind == "event" else sse.data(obj)
    lines = frame.splitlines()                  # the frame's blank line ends it: one empty line
    assert lines[-1] == "" and lines[-2].startswith("data: ")
    assert lines[:-2] == ([] if kind == "data" else ["event: x"])
    assert json.loads(lines[-2][len("data: "):]) == obj      # the same text, escaped or not


@pytest.fixture(scope="module")
def server():
    engine = FakeEngine(chars_per_step=2)
    engine.scripts["BREAKS?"] = TEXT
    _, _, app = make_fake(engine)
    srv = LiveServer(app)
    yield srv.url
    srv.stop()


def _streamed_text(url: str, path: str, body: dict, pick) -> str:
    """The text of a stream read as httpx's aiter_lines-style clients read it."""
    got = []
    with httpx.stream("POST", url + path, json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                got.append(pick(json.loads(line[5:])))      # a cut line raised JSONDecodeError here
    return "".join(t for t in got if t)


def test_every_protocol_streams_the_text_whole(server):
    msgs = [{"role": "user", "content": "BREAKS?"}]
    chat = _streamed_text(server, "/v1/chat/completions",
                          {"model": "capture-model", "messages": msgs, "stream": True, "max_tokens": 200},
                          lambda d: ((d.get("choices") or [{}])[0].get("delta") or {}).get("content"))
    messages = _streamed_text(server, "/v1/messages",
                              {"model": "claude-x", "messages": msgs, "stream": True, "max_tokens": 200},
                              lambda d: (d.get("delta") or {}).get("text"))
    responses = _streamed_text(server, "/v1/responses",
                               {"model": "capture-model", "input": "BREAKS?", "stream": True,
                                "max_output_tokens": 200},
                               lambda d: d.get("delta") if d.get("type") == "response.output_text.delta" else None)
    assert chat == messages == responses == TEXT
