"""Output the token budget cut off is returned as truncated, never dropped or called complete:
a tool call cut mid-arguments comes back as the partial call with finish_reason "length"
(Anthropic: stop_reason "max_tokens"), and a Responses item cut off is "incomplete".
The scripted engine writes one token per byte, so max_tokens cuts at an exact character."""
from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest
from fake_engine import FakeEngine
from live_server import LiveServer, make_fake

from freetoken.server.parsers.qwen import QwenParser

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
CUT = CALL.index("celsius") + 3            # inside the second argument's value
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}}}}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}]


@pytest.fixture(scope="module")
def url():
    _, _, app = make_fake(FakeEngine({"WEATHER?": CALL, "TALK?": "one two three four five six"}))
    srv = LiveServer(app)
    yield srv.url
    srv.stop()


def partial_args() -> str:
    """What the model had written of the arguments when the budget ran out."""
    return CALL[:CUT].split('"arguments": ', 1)[1]


def test_chat_returns_the_cut_call(url):
    c = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    r = c.chat.completions.create(model="capture-model", max_tokens=CUT, tools=TOOLS,
                                  tool_choice="auto", messages=[{"role": "user", "content": "WEATHER?"}])
    ch = r.choices[0]
    assert ch.finish_reason == "length"
    assert [t.function.name for t in ch.message.tool_calls] == ["get_weather"]
    assert ch.message.tool_calls[0].function.arguments == partial_args()
    chunks = list(c.chat.completions.create(model="capture-model", max_tokens=CUT, tools=TOOLS,
                                            stream=True, messages=[{"role": "user", "content": "WEATHER?"}]))
    args = "".join(tc.function.arguments or "" for ch in chunks if ch.choices
                   for tc in ch.choices[0].delta.tool_calls or [])
    assert args == partial_args()
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["length"]


def test_anthropic_returns_the_cut_call(url):
    a = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
    m = a.messages.create(model="capture-model", max_tokens=CUT, tools=ANTHROPIC_TOOLS,
                          messages=[{"role": "user", "content": "WEATHER?"}])
    assert m.stop_reason == "max_tokens"
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input == {"city": "Paris"}   # the cut value left out
    with a.messages.stream(model="capture-model", max_tokens=CUT, tools=ANTHROPIC_TOOLS,
                           messages=[{"role": "user", "content": "WEATHER?"}]) as st:
        raw = "".join(ev.delta.partial_json for ev in st
                      if ev.type == "content_block_delta" and ev.delta.type == "input_json_delta")
        final = st.get_final_message()
    assert raw == partial_args() and final.stop_reason == "max_tokens"
    assert [b.name for b in final.content if b.type == "tool_use"] == ["get_weather"]


def test_a_call_cut_before_its_name_is_not_invented():
    p = QwenParser(TOOLS)
    assert p.feed('<tool_call>\n{"name": "get_wea') == []
    assert p.finish(truncated=True) == []


def test_a_cut_xml_call_keeps_the_parameters_written():
    p = QwenParser(TOOLS)
    evs = p.feed("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\ncel")
    evs += p.finish(truncated=True)
    assert evs[0].name == "get_weather"
    assert json.loads(evs[-1].arguments) == {"city": "Paris", "unit": "cel"}


def test_a_complete_call_is_unchanged_by_the_cut_flag():
    p = QwenParser(TOOLS)
    evs = p.feed(CALL) + p.finish(truncated=True)
    assert json.loads(evs[-1].arguments) == {"city": "Paris", "unit": "celsius"}


@pytest.mark.parametrize("stream", [False, True])
def test_responses_items_cut_off_are_incomplete(url, stream):
    body = {"model": "capture-model", "input": "TALK?", "max_output_tokens": 7}
    if not stream:
        r = httpx.post(url + "/v1/responses", json=body, timeout=30).json()
        items, status = r["output"], r["status"]
        assert r["incomplete_details"] == {"reason": "max_output_tokens"}
    else:
        with httpx.stream("POST", url + "/v1/responses", json=dict(body, stream=True), timeout=30) as s:
            events = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: ")]
        done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
        last = events[-1]
        assert last["type"] == "response.incomplete"
        items, status = last["response"]["output"], last["response"]["status"]
        assert [i["status"] for i in done] == ["incomplete"]
    assert status == "incomplete"
    assert [(i["type"], i["status"]) for i in items] == [("message", "incomplete")]
    assert items[0]["content"][0]["text"] == "one two"
    ok = httpx.post(url + "/v1/responses", json=dict(body, max_output_tokens=500), timeout=30).json()
    assert ok["status"] == "completed" and ok["output"][0]["status"] == "completed"
