"""Parsers on realistic model outputs, split at every possible chunk boundary: the
visible text, reasoning and tool calls must not depend on how the stream was cut, and no
markup may reach the visible text."""
import json
import random

import pytest

from freetoken.server.events import ReasoningDelta, TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart
from freetoken.server.parsers import HarmonyParser, PlainParser, QwenParser, parser_for

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "Read", "parameters": {
        "type": "object", "properties": {"file_path": {"type": "string"}, "limit": {"type": "integer"},
                                         "opts": {"type": "object"}}}}}]

QWEN = [
    # (output, starts in reasoning, text, reasoning, calls)
    ("<think>\nThe user wants the weather in Paris. I should call get_weather.\n</think>\n\n"
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     False, "", "The user wants the weather in Paris. I should call get_weather.",
     [("get_weather", {"city": "Paris"})]),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
     False, "", "", [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})]),
    ("I'll read the file first.\n\n<tool_call>\n"
     '{"name": "Read", "arguments": {"file_path": "/home/user/project/README.md"}}\n</tool_call>',
     False, "I'll read the file first.", "", [("Read", {"file_path": "/home/user/project/README.md"})]),
    ("Hello! How can I help you today?", False, "Hello! How can I help you today?", "", []),
    ("<think>\n\n</think>\n\nUse `a < b` and <b>bold</b> in HTML; a <tool is fine.",
     False, "Use `a < b` and <b>bold</b> in HTML; a <tool is fine.", "", []),
    # Qwen3.5 / Qwen3-Coder XML form; the template opened <think> in the prompt
    ("The user wants README.md. Read it.\n</think>\n\n<tool_call>\n<function=Read>\n"
     "<parameter=file_path>\n/home/user/project/README.md\n</parameter>\n<parameter=limit>\n20\n"
     '</parameter>\n<parameter=opts>\n{"raw": true}\n</parameter>\n</function>\n</tool_call>',
     True, "", "The user wants README.md. Read it.",
     [("Read", {"file_path": "/home/user/project/README.md", "limit": 20, "opts": {"raw": True}})]),
    ("Let me think.\nStep 1: greet.\n</think>\n\nHi there!\nHow are you?", True,
     "Hi there!\nHow are you?", "Let me think.\nStep 1: greet.", []),
    ("Sure.<tool_call>\n{not json at all}\n</tool_call>", False, "Sure.", "", []),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}', False, "", "",
     [("get_weather", {"city": "Rome"})]),
    ('<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Lima\\"}"}</tool_call>',
     False, "", "", [("get_weather", {"city": "Lima"})]),
]

HARMONY = [
    ("<|channel|>analysis<|message|>User asks weather. Need to call tool.<|end|><|start|>assistant"
     '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}',
     "", "User asks weather. Need to call tool.", [("get_weather", {"city": "Paris"})]),
    ("<|channel|>analysis<|message|>Simple greeting.<|end|><|start|>assistant<|channel|>final"
     "<|message|>Hello! How can I help?", "Hello! How can I help?", "Simple greeting.", []),
    ("<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.get_weather"
     '<|channel|>commentary json<|message|>{"city": "Oslo"}<|call|>', "", "x",
     [("get_weather", {"city": "Oslo"})]),
    ("<|channel|>final<|message|>Plain answer <with> angle brackets.<|return|>",
     "Plain answer <with> angle brackets.", "", []),
]


def run(parser, pieces):
    events = []
    for p in pieces:
        events += parser.feed(p)
    events += parser.finish()
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    starts = {e.index: e for e in events if isinstance(e, ToolCallStart)}
    deltas = {}
    for e in events:
        if isinstance(e, ToolCallDelta):
            deltas[e.index] = deltas.get(e.index, "") + e.arguments
    calls = []
    for e in events:
        if isinstance(e, ToolCallEnd):
            assert deltas[e.index] == e.arguments
            calls.append((starts[e.index].name, json.loads(e.arguments)))
    ids = [e.id for e in starts.values()]
    assert len(set(ids)) == len(ids)
    return text, reasoning, calls


def splits(s: str):
    yield [s]
    yield list(s)
    for i in range(1, len(s)):
        yield [s[:i], s[i:]]
    rng = random.Random(len(s))
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(s)), min(4, len(s) - 1)))
        yield [s[a:b] for a, b in zip([0] + cuts, cuts + [len(s)])]


@pytest.mark.parametrize("case", QWEN, ids=[f"qwen{i}" for i in range(len(QWEN))])
def test_qwen_every_split(case):
    out, reasoning_start, text, reasoning, calls = case
    for pieces in splits(out):
        got = run(QwenParser(TOOLS, reasoning=reasoning_start), pieces)
        assert got == (text, reasoning, calls), pieces


@pytest.mark.parametrize("case", HARMONY, ids=[f"harmony{i}" for i in range(len(HARMONY))])
def test_harmony_every_split(case):
    out, text, reasoning, calls = case
    for pieces in splits(out):
        got = run(HarmonyParser(TOOLS), pieces)
        assert got == (text, reasoning, calls), pieces


def test_no_markup_leaks_from_random_qwen_output():
    vocab = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<", "tool", "_call>", "{", "}",
             "<|im_start|>", "<|im_end|>", "<|", "im_", "start|>",
             '"name"', ":", " ", "\n", "hello", "<function=", "x>", "<parameter=", "</"]
    rng = random.Random(0)
    for _ in range(300):
        pieces = [rng.choice(vocab) for _ in range(rng.randint(1, 40))]
        text, _, _ = run(QwenParser(TOOLS), pieces)
        for marker in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_start|>", "<|im_end|>"):
            assert marker not in text


def test_plain_parser_passes_everything():
    s = "Mixtral says <tool_call> and <think> verbatim.\n"
    for pieces in splits(s):
        assert run(PlainParser(TOOLS), pieces) == (s, "", [])


def test_parser_for_architectures():
    assert parser_for("Qwen3MoeForCausalLM") is QwenParser
    assert parser_for("Qwen2MoeForCausalLM") is QwenParser
    assert parser_for("Qwen3_5MoeForCausalLM") is QwenParser
    assert parser_for("Qwen3NextForCausalLM") is QwenParser
    assert parser_for("GptOssForCausalLM") is HarmonyParser
    assert parser_for("MixtralForCausalLM") is PlainParser
    assert parser_for("OlmoeForCausalLM") is PlainParser
    assert parser_for(None) is PlainParser
    # the template wins: it decides what markup the model was taught
    assert parser_for("GptOssForCausalLM", "{{ '<|start|>assistant<|channel|>final' }}") is HarmonyParser
    assert parser_for("GptOssForCausalLM", "<|im_start|>{% if tools %}<tool_call>{% endif %}") is QwenParser
    assert parser_for("Qwen3MoeForCausalLM", "[INST] {{ m }} [/INST]") is PlainParser
