"""The official openai SDK against the scripted engine: chat (stream and not, tools,
reasoning, usage), completions, responses, models, and sampling fields reaching the engine."""
import json

import httpx
import openai
import pytest

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Get weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}}]
WEATHER = ('<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", '
           '"arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", '
           '"arguments": {"city": "Oslo"}}\n</tool_call>')


@pytest.fixture(scope="module")
def client(fake):
    engine, url, _ = fake
    engine.scripts.update({"WEATHER?": WEATHER, "GREET?": "<think>\nGreet back.\n</think>\n\nHello there!",
                           "STOPPY?": "one two STOP three"})
    return openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)


def test_models(client):
    assert [m.id for m in client.models.list()] == ["capture-model", "capture-reasoner"]
    assert client.models.retrieve("capture-model").id == "capture-model"


def test_chat_nonstream_parallel_tool_calls(client):
    r = client.chat.completions.create(model="capture-model", tools=TOOLS,
                                       messages=[{"role": "user", "content": "WEATHER?"}])
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert [json.loads(c.function.arguments) for c in ch.message.tool_calls] == [{"city": "Paris"},
                                                                                 {"city": "Oslo"}]
    assert ch.message.content is None
    assert ch.message.model_extra["reasoning_content"] == "The user wants the weather."
    assert r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0


def test_chat_stream_tools_include_usage(client):
    s = client.chat.completions.create(model="capture-model", tools=TOOLS, tool_choice="auto",
                                       stream=True, stream_options={"include_usage": True},
                                       messages=[{"role": "user", "content": "WEATHER?"}])
    chunks = list(s)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.total_tokens > 0 and chunks[-1].choices == []
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["tool_calls"]
    names = [tc.function.name for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []
             if tc.function and tc.function.name]
    assert names == ["get_weather", "get_weather"]


def test_chat_stream_helper_and_reasoning(client):
    with client.chat.completions.stream(model="capture-model", tools=TOOLS,
                                        messages=[{"role": "user", "content": "GREET?"}]) as st:
        for _ in st:
            pass
        fc = st.get_final_completion()
    assert fc.choices[0].message.content == "Hello there!"
    assert fc.choices[0].finish_reason == "stop"


def test_chat_history_with_tool_results(client, fake):
    r = client.chat.completions.create(model="capture-model", tools=TOOLS, messages=[
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "user", "content": [{"type": "text", "text": "GREET?"}]}])
    assert r.choices[0].message.content == "Hello there!"


def test_sampling_fields_reach_the_engine(client, fake):
    engine = fake[0]
    client.chat.completions.create(model="capture-model", messages=[{"role": "user", "content": "x"}],
                                   max_completion_tokens=7, max_tokens=99, seed=42, temperature=0.3,
                                   top_p=0.9, presence_penalty=0.5, frequency_penalty=0.25,
                                   stop=["\n\n"], extra_body={"top_k": 5, "repetition_penalty": 1.1})
    p = engine.added[-1][1]
    assert (p.max_tokens, p.seed, p.temperature, p.top_p, p.top_k) == (7, 42, 0.3, 0.9, 5)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.5, 0.25, 1.1)
    assert p.stop == ["\n\n"]


def test_stop_string_and_length(client):
    r = client.chat.completions.create(model="capture-model", stop="STOP",
                                       messages=[{"role": "user", "content": "STOPPY?"}])
    assert r.choices[0].message.content == "one two" and r.choices[0].finish_reason == "stop"
    r = client.chat.completions.create(model="capture-model", max_tokens=3,
                                       messages=[{"role": "user", "content": "STOPPY?"}])
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3


def test_completions(client):
    r = client.completions.create(model="capture-model", prompt="GREET?", max_tokens=50)
    assert "Hello there!" in r.choices[0].text and r.choices[0].finish_reason == "stop"
    text = "".join(c.choices[0].text for c in client.completions.create(
        model="capture-model", prompt="GREET?", max_tokens=50, stream=True) if c.choices)
    assert text == r.choices[0].text


def test_responses_nonstream_and_stream(client):
    r = client.responses.create(model="capture-model", input="GREET?")
    assert r.output_text == "Hello there!" and r.status == "completed"
    assert r.output[0].type == "reasoning"
    tools = [{"type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"]}]
    with client.responses.stream(model="capture-model", input="WEATHER?", tools=tools) as st:
        for _ in st:
            pass
        fr = st.get_final_response()
    calls = [o for o in fr.output if o.type == "function_call"]
    assert [json.loads(c.arguments) for c in calls] == [{"city": "Paris"}, {"city": "Oslo"}]


def test_responses_history_items(client):
    r = client.responses.create(model="capture-model", instructions="be brief", input=[
        {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"role": "user", "content": "GREET?"}], max_output_tokens=5)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"


def test_raw_stream_has_done_and_single_finish(fake):
    _, url, _ = fake
    with httpx.stream("POST", url + "/v1/chat/completions", json={
            "model": "capture-model", "stream": True,
            "messages": [{"role": "user", "content": "GREET?"}]}) as r:
        body = r.read().decode()
    assert body.rstrip().endswith("data: [DONE]")
    assert body.count('"finish_reason":"stop"') == 1


def test_parallel_tool_calls_false_keeps_one(client):
    r = client.chat.completions.create(model="capture-model", tools=TOOLS, parallel_tool_calls=False,
                                       messages=[{"role": "user", "content": "WEATHER?"}])
    assert len(r.choices[0].message.tool_calls) == 1 and r.choices[0].finish_reason == "tool_calls"


def test_generation_config_defaults(fake, client, tmp_path):
    from freetoken.server.build import sampling_defaults
    (tmp_path / "generation_config.json").write_text(
        '{"temperature": 0.6, "top_p": 0.95, "top_k": 20, "eos_token_id": [1, 2]}')
    assert sampling_defaults(tmp_path) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    engine, _, svc = fake
    svc.sampling_defaults = {"temperature": 0.6, "top_k": 20}
    try:
        client.chat.completions.create(model="capture-model", temperature=0.1,
                                       messages=[{"role": "user", "content": "x"}])
    finally:
        svc.sampling_defaults = {}
    p = engine.added[-1][1]
    assert (p.temperature, p.top_k) == (0.1, 20)
