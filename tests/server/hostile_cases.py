"""Hand-written hostile requests: (path, raw body bytes). Each must get a protocol-shaped
4xx, never a 500, and the server must keep serving. Shared by the test and bench/fuzz."""
from __future__ import annotations

import json

OA, AN, RESP, CMPL, COUNT = ("/v1/chat/completions", "/v1/messages", "/v1/responses",
                             "/v1/completions", "/v1/messages/count_tokens")
U = [{"role": "user", "content": "hi"}]


def _oa(**kw):
    return {"model": "capture-model", "messages": U, "max_tokens": 4, **kw}


def _an(**kw):
    return {"model": "claude-x", "max_tokens": 4, "messages": U, **kw}


def _resp(**kw):
    return {"model": "capture-model", "input": "hi", "max_output_tokens": 4, **kw}


def _asst(**kw):
    return [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x", **kw},
            {"role": "user", "content": "go"}]


BAD_SCHEMA_TOOL = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "no-such-type"}}}}}]
DEEP_SCHEMA = '{"type": "object", "properties": {"a": ' * 2000 + '{"type": "object"}' + "}}" * 2000

CASES: list[tuple[str, str, object]] = [
    # (name, path, body: dict -> JSON, or bytes sent as is)
    ("deep-json", OA, b"[" * 10000 + b"]" * 10000),
    ("deep-json-object", OA, ('{"a":' * 10000 + "1" + "}" * 10000).encode()),
    ("lone-surrogate", OA, b'{"model": "capture-model", "messages": [{"role": "user", "content": "\\ud800"}]}'),
    ("lone-surrogate-anthropic", AN, b'{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "a\\udfffb"}]}'),
    ("invalid-utf8", OA, b'{"model": "capture-model", "messages": [{"role": "user", "content": "\xff\xfe"}]}'),
    ("not-an-object", OA, b"[1, 2]"),
    ("tool_calls-str", OA, _oa(messages=_asst(tool_calls=["x"]))),
    ("tool_calls-function-str", OA, _oa(messages=_asst(tool_calls=[{"function": "x"}]))),
    ("tool_calls-name-int", OA, _oa(messages=_asst(tool_calls=[{"function": {"name": 5, "arguments": 7}}]))),
    ("tool_choice-function-str", OA, _oa(tool_choice={"type": "function", "function": "x"})),
    ("tool_choice-name-int", OA, _oa(tool_choice={"type": "function", "function": {"name": 5}})),
    ("response_format-json_schema-str", OA, _oa(response_format={"type": "json_schema", "json_schema": "x"})),
    ("response_format-type-int", OA, _oa(response_format={"type": 5})),
    ("response_format-bad-schema", OA, _oa(response_format={"type": "json_schema", "json_schema": {
        "schema": {"type": "no-such-type"}}})),
    ("response_format-deep-schema", OA, json.dumps(_oa(response_format={
        "type": "json_schema", "json_schema": {"schema": "@"}})).replace('"@"', DEEP_SCHEMA).encode()),
    ("response_format-bad-ref", OA, _oa(response_format={"type": "json_schema", "json_schema": {
        "schema": {"$ref": "#/nowhere"}}})),
    ("response_format-huge-regex", OA, _oa(response_format={"type": "json_schema", "json_schema": {
        "schema": {"type": "string", "pattern": "(a|aa)*" * 200 + "[" * 50}}})),
    ("response_format-8000-anyOf", OA, _oa(response_format={"type": "json_schema", "json_schema": {
        "schema": {"anyOf": [{"type": "object", "properties": {f"k{i}": {"const": i}}, "required": [f"k{i}"]}
                             for i in range(8000)]}}})),
    ("tool-invalid-schema-forced", OA, _oa(tools=BAD_SCHEMA_TOOL, tool_choice="required")),
    ("tool-unknown-forced", OA, _oa(tools=BAD_SCHEMA_TOOL, tool_choice={"type": "function",
                                                                         "function": {"name": "nope"}})),
    ("tools-str", OA, _oa(tools=["x"])),
    ("tool-name-dict", OA, _oa(tools=[{"type": "function", "function": {"name": {"a": 1}}}])),
    ("content-part-int", OA, _oa(messages=[{"role": "user", "content": [5]}])),
    ("content-part-text-dict", OA, _oa(messages=[{"role": "user", "content": [{"type": "text", "text": {"a": 1}}]}])),
    ("role-int", OA, _oa(messages=[{"role": 5, "content": "x"}])),
    ("tool-call-id-dict", OA, _oa(messages=[{"role": "tool", "content": "x", "tool_call_id": {"a": 1}}])),
    ("max_tokens-negative", OA, _oa(max_tokens=-5)),
    ("max_tokens-zero", OA, _oa(max_tokens=0)),
    ("max_tokens-str", OA, _oa(max_tokens="many")),
    ("n-2", OA, _oa(n=2)),
    ("stop-int", OA, _oa(stop=[5])),
    ("temperature-str", OA, _oa(temperature="hot")),
    ("top_k-negative", OA, _oa(top_k=-3)),
    ("chat_template_kwargs-clash", OA, _oa(chat_template_kwargs={"add_generation_prompt": "x", "tools": 5})),
    ("template-escape", OA, _oa(chat_template_kwargs={"chat_template":
                                                      "{{ ''.__class__.__mro__[1].__subclasses__() }}"})),
    ("template-escape-2", OA, _oa(messages=[{"role": "user", "content":
                                             "{{ cycler.__init__.__globals__.os.popen('id').read() }}"}],
                                  chat_template_kwargs={"chat_template":
                                                        "{{ cycler.__init__.__globals__.os.popen('id').read() }}"})),
    ("completions-token-out-of-vocab", CMPL, {"model": "capture-model", "prompt": [10**12], "max_tokens": 2}),
    ("completions-token-negative", CMPL, {"model": "capture-model", "prompt": [-1], "max_tokens": 2}),
    ("completions-prompt-dict", CMPL, {"model": "capture-model", "prompt": {"a": 1}}),
    ("anthropic-text-int", AN, _an(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}])),
    ("anthropic-system-text-int", AN, _an(system=[{"type": "text", "text": 5}])),
    ("anthropic-assistant-int", AN, _an(messages=[{"role": "user", "content": "x"},
                                                  {"role": "assistant", "content": 5}])),
    ("anthropic-tool_use-input-str", AN, _an(messages=[
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "x"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": 5, "content": "ok"}]}])),
    ("anthropic-tool_choice-name-int", AN, _an(tool_choice={"type": "tool", "name": 5})),
    ("anthropic-thinking-type-int", AN, _an(thinking={"type": 5})),
    ("anthropic-thinking-str", AN, _an(thinking="x")),
    ("anthropic-tool-schema-str", AN, _an(tools=[{"name": "f", "input_schema": "x"}])),
    ("anthropic-tool-name-int", AN, _an(tools=[{"name": 5, "input_schema": {"type": "object"}}])),
    ("anthropic-max_tokens-missing", AN, {"model": "m", "messages": U}),
    ("count-tokens-text-int", COUNT, {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}),
    ("responses-input-str-item", RESP, _resp(input=["x"])),
    ("responses-function_call-args-int", RESP, _resp(input=[{"type": "function_call", "name": 5, "arguments": 5},
                                                            {"type": "function_call_output", "output": 5}])),
    ("responses-reasoning-content-str", RESP, _resp(input=[{"type": "reasoning", "content": 5}])),
    ("responses-text-format-str", RESP, _resp(text={"format": "x"})),
    ("responses-reasoning-str", RESP, _resp(reasoning="x")),
    ("responses-tools-str", RESP, _resp(tools=["x"])),
    ("responses-tool_choice-name-int", RESP, _resp(tool_choice={"type": "function", "name": 5})),
]


def encoded(body) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode()
