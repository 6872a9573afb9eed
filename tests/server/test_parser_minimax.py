"""MiniMax-M2's parser on hand-written outputs split at every chunk boundary, and on assistant
turns rendered by MiniMax-M2's real chat template: what the template writes for a turn must
parse back to that turn's reasoning, text and tool calls, and those, sent back as the next
request's history, must render to the very text the model wrote (the prefix cache reuses it)."""
import json
import random
import shutil
from pathlib import Path

import pytest

from freetoken.server.chat import starts_in_reasoning
from freetoken.server.events import ToolCallEnd, ToolCallStart
from freetoken.server.parsers import MiniMaxParser, QwenParser, parser_for
from freetoken.tokenizer import Tokenizer

from test_server_parsers import TOOLS as BASE_TOOLS, run, splits

TEMPLATE = Path(__file__).parent / "templates" / "MiniMax-M2.jinja"
TOOLS = BASE_TOOLS + [{"type": "function", "function": {"name": "Edit", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "new": {"type": "string"},
                                     "replace_all": {"type": "boolean"}, "lines": {"type": "array"},
                                     "scale": {"type": "number"}}}}}]
C, CC = "<minimax:tool_call>", "</minimax:tool_call>"

CASES = [
    # (output, starts in reasoning, text, reasoning, calls)
    ("The user wants Paris weather.\n</think>\n\nLet me check.\n" + C + '\n<invoke name="get_weather">\n'
     '<parameter name="city">Paris</parameter>\n</invoke>\n' + CC, True,
     "Let me check.", "The user wants Paris weather.", [("get_weather", {"city": "Paris"})]),
    # several invokes in one block, typed by the schema
    ("Two calls.\n</think>\n\n" + C + '\n<invoke name="Read">\n<parameter name="file_path">/tmp/a b.md</parameter>\n'
     '<parameter name="limit">20</parameter>\n<parameter name="opts">{"raw": true}</parameter>\n</invoke>\n'
     '<invoke name="Edit">\n<parameter name="path">x.py</parameter>\n<parameter name="replace_all">false</parameter>\n'
     '<parameter name="lines">[1, 2]</parameter>\n<parameter name="scale">0.5</parameter>\n'
     '<parameter name="new">def f():\n    return 1\n</parameter>\n</invoke>\n' + CC, True, "", "Two calls.",
     [("Read", {"file_path": "/tmp/a b.md", "limit": 20, "opts": {"raw": True}}),
      ("Edit", {"path": "x.py", "replace_all": False, "lines": [1, 2], "scale": 0.5, "new": "def f():\n    return 1\n"})]),
    # two blocks with text between them
    (C + '<invoke name="get_weather"><parameter name="city">Oslo</parameter></invoke>' + CC + "Then:" + C +
     '<invoke name="get_weather"><parameter name="city">Rome</parameter></invoke>' + CC, False, "Then:", "",
     [("get_weather", {"city": "Oslo"}), ("get_weather", {"city": "Rome"})]),
    # a string the schema calls a string stays text even when it reads as JSON
    (C + '<invoke name="get_weather"><parameter name="city">42</parameter></invoke>' + CC, False, "", "",
     [("get_weather", {"city": "42"})]),
    # prose with angle brackets, a lone role bracket, a stray closer
    ("Done.</think>Use `a < b`, <b>bold</b>, an <invoke> or <minimax:tool in prose.[e~[", True,
     "Use `a < b`, <b>bold</b>, an <invoke> or <minimax:tool in prose.", "Done.", []),
    ("</think>\n\nHi!</minimax:tool_call>", True, "Hi!", "", []),
    # an invoke without a name is dropped; the text after the block still comes
    ("Sure." + C + "\n<invoke>\n<parameter name=\"city\">x</parameter>\n</invoke>\n" + CC + "Sorry.", False,
     "Sure.Sorry.", "", []),
    # a value that is not JSON where the schema wants a number is kept as written
    (C + '<invoke name="Read"><parameter name="file_path">a</parameter><parameter name="limit">ten</parameter>'
     "</invoke>" + CC, False, "", "", [("Read", {"file_path": "a", "limit": "ten"})]),
    # the model stopped before closing: the invoke as written
    (C + '\n<invoke name="Read">\n<parameter name="file_path">/x</parameter>\n<parameter name="limit">5', False,
     "", "", [("Read", {"file_path": "/x", "limit": 5})]),
    (C + '\n<invoke name="get_wea', False, "", "", []),
]


@pytest.mark.parametrize("case", CASES, ids=[f"minimax{i}" for i in range(len(CASES))])
def test_minimax_every_split(case):
    out, reasoning_start, text, reasoning, calls = case
    for pieces in splits(out):
        assert run(MiniMaxParser(TOOLS, reasoning=reasoning_start), pieces) == (text, reasoning, calls), pieces


def test_a_cut_invoke_keeps_the_parameters_written():
    out = "Plan.</think>" + C + '\n<invoke name="Edit">\n<parameter name="path">a.py</parameter>\n<parameter name="new">x = 1\ny'
    for pieces in splits(out):
        p = MiniMaxParser(TOOLS, reasoning=True)
        evs = [e for piece in pieces for e in p.feed(piece)] + p.finish(truncated=True)
        (start,) = [e for e in evs if isinstance(e, ToolCallStart)]
        (end,) = [e for e in evs if isinstance(e, ToolCallEnd)]
        assert start.name == "Edit" and json.loads(end.arguments) == {"path": "a.py", "new": "x = 1\ny"}
    p = MiniMaxParser(TOOLS)
    assert p.feed(C + '\n<invoke name="Ed') == [] and p.finish(truncated=True) == []


def _tokenizer(tiny_dir, tmp_path) -> Tokenizer:
    """The tiny tokenizer with MiniMax-M2's template as the checkpoint's chat_template.jinja."""
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tiny_dir("qwen3_moe") / f, tmp_path / f)
    shutil.copy(TEMPLATE, tmp_path / "chat_template.jinja")
    return Tokenizer(tmp_path)


def _wire(reasoning, text, calls):
    """The assistant message a client sends back for a parsed turn (OpenAI shape, arguments
    as the dict the server's chat layer hands the template)."""
    msg = {"role": "assistant", "content": text, "reasoning_content": reasoning}
    if calls:
        msg["tool_calls"] = [{"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
                             for i, (n, a) in enumerate(calls)]
    return msg


# (reasoning, text, calls) of the turns of one agent session, each after the previous one's tool results
TURNS = [
    ("Need the weather and the README.", "I'll check both.",
     [("get_weather", {"city": "São Paulo"}),
      ("Read", {"file_path": "/home/u/a <b>.md", "limit": 20, "opts": {"raw": True, "n": [1, 2]}})]),
    ("Fix the file.\nTwo edits.", "",
     [("Edit", {"path": "a.py", "new": "def f():\n    return '<x>'\n", "replace_all": True, "lines": [3],
                "scale": 1.5})]),
    ("All done.", "Both done: 21°C and the README is fixed. 👋", []),
]


def test_real_template_session_round_trips(tiny_dir, tmp_path):
    tok = _tokenizer(tiny_dir, tmp_path)
    assert parser_for("MiniMaxM2ForCausalLM", tok.chat_template) is MiniMaxParser
    history = [{"role": "system", "content": "You are a coding agent."},
               {"role": "user", "content": "Weather, then fix a.py."}]
    for i, (reasoning, text, calls) in enumerate(TURNS):
        prompt = tok.apply_chat_template(history, tools=TOOLS)
        assert starts_in_reasoning(prompt)
        full = tok.apply_chat_template(history + [_wire(reasoning, text, calls)], tools=TOOLS,
                                       add_generation_prompt=False)
        assert full.startswith(prompt), "the rendered turn must continue the generation prompt"
        generated = full[len(prompt):].split("[e~[")[0]          # [e~[ ends the turn (the stop token)
        assert generated.count("<invoke name=") == len(calls)
        for pieces in splits(generated):
            got = run(MiniMaxParser(TOOLS, reasoning=True), pieces)
            assert got == (text, reasoning, calls), pieces
        # what the parser gave back, sent as history, renders to the model's own text
        got_text, got_reasoning, got_calls = run(MiniMaxParser(TOOLS, reasoning=True), [generated])
        history.append(_wire(got_reasoning, got_text, got_calls))
        again = tok.apply_chat_template(history, tools=TOOLS, add_generation_prompt=False)
        assert again.startswith(prompt + generated)
        history += [{"role": "tool", "tool_call_id": f"call_{k}", "content": f"result {k}"} for k in range(len(calls))]
    # a new user turn: the template drops the finished loop's thinking, keeps its calls
    history.append({"role": "user", "content": "Thanks."})
    later = tok.apply_chat_template(history, tools=TOOLS).split("]~b]user", 1)[1]   # after the tools' prompt
    assert later.count("<think>") == 1 and later.endswith("]~b]ai\n<think>\n")
    assert later.count("<invoke name=") == 3


def test_parser_for_minimax():
    assert parser_for("MiniMaxM2ForCausalLM") is MiniMaxParser
    assert parser_for("Qwen3MoeForCausalLM", TEMPLATE.read_text()) is MiniMaxParser
    assert parser_for("MiniMaxM2ForCausalLM", "<|im_start|>{% if tools %}<tool_call>{% endif %}") is QwenParser


def test_no_markup_leaks_from_random_minimax_output():
    vocab = ["<think>", "</think>", C, CC, '<invoke name="get_weather">', "</invoke>", '<parameter name="city">',
             "</parameter>", "<", "minimax:", "tool_call>", "[e~[", "]~b]", "ai", "[e~", "]~", "Paris", " ", "\n",
             "hello", "</"]
    rng = random.Random(0)
    for _ in range(300):
        pieces = [rng.choice(vocab) for _ in range(rng.randint(1, 40))]
        text, _, _ = run(MiniMaxParser(TOOLS), pieces)
        for marker in ("<think>", "</think>", C, CC, "[e~[", "]~b]"):
            assert marker not in text
