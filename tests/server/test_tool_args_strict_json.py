"""Issue 25.2: a generated tool call with numbers strict JSON cannot hold (1e999, NaN,
Infinity) never reaches a reply as `Infinity`, never turns a reply into a 500: the number is
kept as its text, or that call alone is dropped. Every protocol's reply is strict JSON."""
import json
import logging

import httpx
import pytest

from freetoken.server.events import ToolCallEnd
from freetoken.server.parsers import DeepSeekParser, GlmParser, HarmonyParser, QwenParser

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"n": {"type": "number"}}}}}]


def _strict(text: str):
    def refuse(c):
        raise AssertionError(f"not strict JSON: {c}")
    return json.loads(text, parse_constant=refuse)


def _calls(parser, text):
    evs = parser.feed(text) + parser.finish()
    return [e.arguments for e in evs if isinstance(e, ToolCallEnd)]


@pytest.mark.parametrize("number", ["1e999", "-1e999", "1E+400"])
def test_huge_number_kept_as_text(number):
    out = _calls(QwenParser(TOOLS), f'<tool_call>{{"name": "f", "arguments": {{"n": {number}}}}}</tool_call>')
    assert [_strict(a) for a in out] == [{"n": number}]
    xml = _calls(QwenParser(TOOLS), f"<tool_call><function=f><parameter=n>{number}</parameter></function></tool_call>")
    assert [_strict(a) for a in xml] == [{"n": number}]
    glm = _calls(GlmParser(TOOLS), f"<tool_call>f<arg_key>n</arg_key><arg_value>{number}</arg_value></tool_call>")
    assert [_strict(a) for a in glm] == [{"n": number}]


@pytest.mark.parametrize("const", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_constants_never_written(const):
    bad = f'<tool_call>{{"name": "f", "arguments": {{"n": {const}}}}}</tool_call>'
    good = '<tool_call>{"name": "f", "arguments": {"n": 1}}</tool_call>'
    out = _calls(QwenParser(TOOLS), bad + good)         # the bad call alone is dropped
    assert [_strict(a) for a in out] == [{"n": 1}]
    for a in _calls(QwenParser(TOOLS), f"<tool_call><function=f><parameter=n>{const}</parameter></function></tool_call>"):
        _strict(a)
    h = HarmonyParser(TOOLS)
    for a in _calls(h, f'<|channel|>commentary to=functions.f <|constrain|>json<|message|>{{"n": {const}}}<|call|>'):
        _strict(a)


def test_deepseek_huge_number():
    p = DeepSeekParser(TOOLS)
    text = ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"n": 1e999}<｜tool▁call▁end｜>'
            '<｜tool▁calls▁end｜>')
    assert [_strict(a) for a in _calls(p, text)] == [{"n": "1e999"}]


def test_dropped_call_logs_no_generated_text(caplog):
    with caplog.at_level(logging.WARNING):
        _calls(QwenParser(TOOLS), '<tool_call>{"name": "f", "arguments": SECRET-TEXT NaN}</tool_call>')
    assert caplog.records and not any("SECRET" in r.getMessage() for r in caplog.records)


SCRIPT = '<tool_call>\n{"name": "f", "arguments": {"n": 1e999, "m": 2}}\n</tool_call>'


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", ["/v1/messages", "/v1/chat/completions", "/v1/responses"])
def test_every_protocol_replies_strict_json(fake, route, stream):
    engine, url, _ = fake
    engine.scripts["HUGE-NUMBER?"] = SCRIPT
    msgs = [{"role": "user", "content": "HUGE-NUMBER?"}]
    body = {"model": "capture-model", "stream": stream, "tools": TOOLS, "max_tokens": 200}
    if route == "/v1/messages":
        body.update(messages=msgs, tools=[{"name": "f", "input_schema": TOOLS[0]["function"]["parameters"]}])
    elif route == "/v1/responses":
        body.update(input=msgs, tools=[{"type": "function", **TOOLS[0]["function"]}])
        body["max_output_tokens"] = body.pop("max_tokens")
    else:
        body.update(messages=msgs)
    r = httpx.post(url + route, json=body, timeout=60)
    assert r.status_code == 200, r.text[:300]
    if not stream:
        _strict(r.text)
        assert "1e999" in r.text
        return
    seen = False
    for line in r.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            _strict(line[6:])
            seen |= "1e999" in line
    assert seen
