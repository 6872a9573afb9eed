"""GLM's parser on hand-written outputs split at every chunk boundary, and on assistant turns
rendered by GLM's real chat templates (GLM-4.6 and GLM-4.7-Flash): what the template writes
for a turn must parse back to that turn's reasoning, text and tool calls."""
import random
from pathlib import Path

import pytest

from freetoken.server.chat import starts_in_reasoning
from freetoken.server.parsers import GlmParser, QwenParser, parser_for
from freetoken.tokenizer import Tokenizer

from test_server_parsers import TOOLS, run, splits

TEMPLATES = Path(__file__).parent / "templates"

GLM = [
    # (output, starts in reasoning, text, reasoning, calls)
    ("\n<think>The user wants Paris weather.</think>\nLet me check.\n<tool_call>get_weather\n"
     "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
     False, "Let me check.", "The user wants Paris weather.", [("get_weather", {"city": "Paris"})]),
    ("Read it first.</think><tool_call>Read<arg_key>file_path</arg_key><arg_value>/tmp/a b.md</arg_value>"
     '<arg_key>limit</arg_key><arg_value>20</arg_value><arg_key>opts</arg_key><arg_value>{"raw": true}'
     "</arg_value></tool_call><tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>",
     True, "", "Read it first.",
     [("Read", {"file_path": "/tmp/a b.md", "limit": 20, "opts": {"raw": True}}), ("get_weather", {"city": "Oslo"})]),
    ("\n<think></think>\nUse `a < b` and <b>bold</b>; a <tool or <arg_key> in prose is fine.", False,
     "Use `a < b` and <b>bold</b>; a <tool or <arg_key> in prose is fine.", "", []),
    # a string value that looks like JSON stays a string where the schema says string
    ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>42</arg_value>\n</tool_call>", False, "", "",
     [("get_weather", {"city": "42"})]),
    ("Hello<|user|>", False, "Hello", "", []),
    ("<tool_call>\n<arg_key>city</arg_key><arg_value>x</arg_value></tool_call>Done.", False, "Done.", "", []),
    ("<tool_call>Read<arg_key>file_path</arg_key><arg_value>/x", False, "", "", [("Read", {"file_path": "/x"})]),
]


@pytest.mark.parametrize("case", GLM, ids=[f"glm{i}" for i in range(len(GLM))])
def test_glm_every_split(case):
    out, reasoning_start, text, reasoning, calls = case
    for pieces in splits(out):
        assert run(GlmParser(TOOLS, reasoning=reasoning_start), pieces) == (text, reasoning, calls), pieces


TURNS = [
    ("Weather in Paris and the README?", "Two tools needed.", "I'll check both.",
     [("get_weather", {"city": "Paris"}),
      ("Read", {"file_path": "/home/u/a <b>.md", "limit": 20, "opts": {"raw": True, "n": [1, 2]}})]),
    ("Just say hi.", "", "Hi! 👋\nHow can I help?", []),
    ("Read README.", "", "", [("Read", {"file_path": "README.md", "limit": 5})]),
    ("Think, then answer.", "Line one.\nLine two.", "The answer is 4.", []),
]


def _tokenizer(tiny_dir, template: str) -> Tokenizer:
    tok = Tokenizer(tiny_dir("qwen3_moe"))
    tok.chat_template = (TEMPLATES / template).read_text()
    return tok


@pytest.mark.parametrize("template", ["GLM-4.6.jinja", "GLM-4.7-Flash.jinja"])
@pytest.mark.parametrize("turn", range(len(TURNS)))
def test_real_template_turns_parse_back(tiny_dir, template, turn):
    user, reasoning, text, calls = TURNS[turn]
    tok = _tokenizer(tiny_dir, template)
    assert parser_for("Glm4MoeForCausalLM", tok.chat_template) is GlmParser
    tool_calls = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]
    history = [{"role": "user", "content": user}]
    reply = {"role": "assistant", "content": text, "tool_calls": tool_calls}
    if reasoning:
        reply["reasoning_content"] = reasoning
    kw = {} if reasoning else {"enable_thinking": False}
    prompt = tok.apply_chat_template(history, tools=TOOLS, **kw)
    full = tok.apply_chat_template(history + [reply], tools=TOOLS, add_generation_prompt=False, **kw)
    assert full.startswith(prompt), "the rendered turn must continue the generation prompt"
    generated = full[len(prompt):]
    assert ("<arg_key>" in generated) == bool(calls)
    for pieces in splits(generated):
        got = run(GlmParser(TOOLS, reasoning=starts_in_reasoning(prompt)), pieces)
        assert got == (text, reasoning, calls), pieces


def test_parser_for_glm():
    assert parser_for("Glm4MoeForCausalLM") is GlmParser
    assert parser_for("GlmMoeDsaForCausalLM") is GlmParser
    assert parser_for("Qwen3MoeForCausalLM", (TEMPLATES / "GLM-4.6.jinja").read_text()) is GlmParser
    assert parser_for("Glm4MoeForCausalLM", "<|im_start|>{% if tools %}<tool_call>{% endif %}") is QwenParser


def test_no_markup_leaks_from_random_glm_output():
    vocab = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
             "</arg_value>", "<", "tool", "_call>", "<|user|>", "<|observation|>", "<|", "user|>", "Read",
             "city", " ", "\n", "hello", "</"]
    rng = random.Random(0)
    for _ in range(300):
        pieces = [rng.choice(vocab) for _ in range(rng.randint(1, 40))]
        text, _, _ = run(GlmParser(TOOLS), pieces)
        for marker in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<|user|>", "<|observation|>"):
            assert marker not in text
