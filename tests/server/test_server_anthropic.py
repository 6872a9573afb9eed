"""The official anthropic SDK against the scripted engine: messages (stream and not, tools,
thinking), the raw event sequence, count_tokens, system forms, tool results, auth forms."""
import anthropic
import httpx
import pytest
from sse_check import check_anthropic_stream

TOOLS = [{"name": "get_weather", "description": "Get weather",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}]
WEATHER = ('<think>\nNeed the tool.\n</think>\n\nLet me check.\n<tool_call>\n{"name": "get_weather", '
           '"arguments": {"city": "Paris"}}\n</tool_call>')


@pytest.fixture(scope="module")
def client(fake):
    engine, url, _ = fake
    engine.scripts.update({"AN_WEATHER?": WEATHER, "AN_HI?": "<think>\nSay hi.\n</think>\n\nHi!",
                           "AN_STOP?": "alpha beta END gamma"})
    return anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)


def test_nonstream_tools_and_thinking(client):
    m = client.messages.create(model="claude-opus-5-5", max_tokens=500, tools=TOOLS,
                               thinking={"type": "enabled", "budget_tokens": 100},
                               system="be brief", messages=[{"role": "user", "content": "AN_WEATHER?"}])
    assert [b.type for b in m.content] == ["thinking", "text", "tool_use"]
    assert m.content[0].thinking == "Need the tool." and m.content[1].text == "Let me check."
    assert m.content[2].input == {"city": "Paris"} and m.content[2].id.startswith("toolu_")
    assert m.stop_reason == "tool_use" and m.model == "claude-opus-5-5"
    assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0


def test_stream_helper_with_cache_control(client):
    with client.messages.stream(model="capture-model", max_tokens=500, tools=TOOLS,
                                tool_choice={"type": "auto"},
                                system=[{"type": "text", "text": "be brief",
                                         "cache_control": {"type": "ephemeral"}}],
                                messages=[{"role": "user", "content": "AN_WEATHER?"}]) as st:
        for _ in st:
            pass
        m = st.get_final_message()
    assert m.content[-1].type == "tool_use" and m.content[-1].input == {"city": "Paris"}
    assert m.stop_reason == "tool_use" and m.usage.output_tokens > 0


def test_raw_event_sequence(client, fake):
    raw = client.messages.create(model="capture-model", max_tokens=500, tools=TOOLS, stream=True,
                                 messages=[{"role": "user", "content": "AN_WEATHER?"}])
    types = [e.type for e in raw]
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
    assert "content_block_start" in types and "content_block_stop" in types
    _, url, _ = fake
    r = httpx.post(url + "/v1/messages?beta=true", json={
        "model": "claude-x", "max_tokens": 500, "stream": True, "tools": TOOLS,
        "thinking": {"type": "adaptive"}, "context_management": {"edits": []}, "unknown_field": 1,
        "messages": [{"role": "user", "content": "AN_WEATHER?"}]})
    got = check_anthropic_stream(r.text)
    assert [b["type"] for b in got["blocks"]] == ["thinking", "text", "tool_use"]
    assert got["blocks"][2]["input"] == {"city": "Paris"}


def test_history_with_tool_result_and_inline_system(client, fake):
    m = client.messages.create(model="capture-model", max_tokens=100, tools=TOOLS, messages=[
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {"role": "system", "content": "environment: linux"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "tool", "signature": "x"},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}],
             "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "AN_HI?"}]}])
    assert m.content[-1].text == "Hi!" and m.stop_reason == "end_turn"


def test_thinking_off_unless_asked(client, fake):
    engine = fake[0]
    client.messages.create(model="capture-model", max_tokens=5,
                           messages=[{"role": "user", "content": "plain"}])
    # the scripted template closes an empty reasoning block when enable_thinking is False
    prompt = engine.tokenizer.decode(engine_prompt(engine))
    assert prompt.endswith("<think>\n\n</think>\n\n")


def engine_prompt(engine):
    rid, _ = engine.added[-1]
    return LAST_PROMPTS.get(rid, [])


LAST_PROMPTS = {}


@pytest.fixture(autouse=True)
def _record_prompts(fake, monkeypatch):
    engine = fake[0]
    orig = engine.add_request

    def add(rid, ids, params):
        LAST_PROMPTS[rid] = list(ids)
        return orig(rid, ids, params)
    monkeypatch.setattr(engine, "add_request", add)


def test_stop_sequences(client):
    m = client.messages.create(model="capture-model", max_tokens=100, stop_sequences=["END"],
                               messages=[{"role": "user", "content": "AN_STOP?"}])
    assert m.content[0].text == "alpha beta" and m.stop_reason == "stop_sequence"
    assert m.stop_sequence == "END"


def test_count_tokens(client):
    n = client.messages.count_tokens(model="claude-x", tools=TOOLS,
                                     messages=[{"role": "user", "content": "say hi"}])
    assert n.input_tokens > 10


def test_models_list_anthropic_shape(client):
    ids = [m.id for m in client.models.list()]
    assert ids[0] == "capture-model"
