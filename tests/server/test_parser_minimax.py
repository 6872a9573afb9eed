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
      ("Edit", {"path": "x.py", "replace_all": False, "lines": [1, 2], "scale": 0.5,
                "new": "def f():\n    return 1\n"})]),
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
    out = ("Plan.</think>" + C + '\n<invoke name="Edit">\n<parameter name="path">a.py</parameter>\n'
           '<parameter name="new">x = 1\ny')
    for pieces in splits(out):
        p = MiniMaxParser(TOOLS, reasoning=True)
        evs = [e for piece in pieces for e in p.feed(piece)] + p.finish(truncated=True)
        (start,) = [e for e in evs if isinstance(e, ToolCallStart)]
        (end,) = [e for e in evs if isinstance(e, ToolCallEnd)]
        assert start.name == "Edit" and json.loads(end.arguments) == {"path": "a.py", "new": "x = 1\ny"}
    p = MiniMaxParser(TOOLS)
    assert p.feed(C + '\n<invoke name="Ed') == [] and p.finish(truncated=True) == []


def test_a_cut_at_any_point_gives_the_calls_as_far_as_written():
    """The token budget ends the output anywhere: every call returned is one of the real calls
    with each value a prefix of the real one, never a half-written closing tag."""
    for k in range(len(OUT)):
        p = MiniMaxParser(TOOLS)
        evs = p.feed(OUT[:k]) + p.finish(truncated=True)
        got = [(s.name, json.loads(e.arguments)) for s, e in zip(
            [e for e in evs if isinstance(e, ToolCallStart)], [e for e in evs if isinstance(e, ToolCallEnd)])]
        assert len(got) <= len(WANT)
        for (name, args), (want_name, want) in zip(got, WANT):
            assert name == want_name and set(args) <= set(want), (k, got)
            assert all(str(want[a]).startswith(str(v)) for a, v in args.items()), (k, got)
        if k >= OUT.index("</invoke>") + len("</invoke>"):
            assert got[0] == WANT[0]


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


# through the APIs: a scripted engine writing MiniMax-M2 markup one token per byte, the service
# choosing the parser from the architecture as it does for a checkpoint without a template file
OUT = ("<think>\nTwo cities.\n</think>\n\nChecking.\n" + C + '\n<invoke name="get_weather">\n<parameter name="city">'
       'Paris</parameter>\n</invoke>\n<invoke name="Read">\n<parameter name="file_path">/a.md</parameter>\n'
       '<parameter name="limit">3</parameter>\n</invoke>\n' + CC)
WANT = [("get_weather", {"city": "Paris"}), ("Read", {"file_path": "/a.md", "limit": 3})]


@pytest.fixture(scope="module")
def minimax_url():
    from fake_engine import FakeEngine
    from live_server import LiveServer, make_fake
    _, svc, app = make_fake(FakeEngine({"WEATHER?": OUT}), architecture="MiniMaxM2ForCausalLM")
    assert svc.parser_cls is MiniMaxParser
    srv = LiveServer(app)
    yield srv.url
    srv.stop()


def test_openai_and_anthropic_get_the_calls(minimax_url):
    import anthropic
    import openai
    c = openai.OpenAI(base_url=minimax_url + "/v1", api_key="k", max_retries=0)
    msgs = [{"role": "user", "content": "WEATHER?"}]
    r = c.chat.completions.create(model="capture-model", tools=TOOLS, messages=msgs).choices[0]
    assert r.finish_reason == "tool_calls" and r.message.content == "Checking."
    assert r.message.model_extra["reasoning_content"] == "Two cities."
    assert [(t.function.name, json.loads(t.function.arguments)) for t in r.message.tool_calls] == WANT
    args: dict[int, str] = {}
    names, text = {}, ""
    for ch in c.chat.completions.create(model="capture-model", tools=TOOLS, messages=msgs, stream=True):
        for d in ch.choices[:1]:
            text += d.delta.content or ""
            assert "<" not in (d.delta.content or "") and "]~" not in (d.delta.content or "")
            for tc in d.delta.tool_calls or []:
                names.setdefault(tc.index, tc.function.name)
                args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
    assert text == "Checking." and [(names[i], json.loads(args[i])) for i in sorted(args)] == WANT
    a = anthropic.Anthropic(base_url=minimax_url, api_key="k", max_retries=0)
    m = a.messages.create(model="capture-model", max_tokens=500, messages=msgs,
                          tools=[{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
                                 for t in TOOLS])
    assert m.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in m.content if b.type == "tool_use"] == WANT
    assert [b.thinking for b in m.content if b.type == "thinking"] == ["Two cities."]


def test_a_cut_call_comes_back_as_length(minimax_url):
    import openai
    c = openai.OpenAI(base_url=minimax_url + "/v1", api_key="k", max_retries=0)
    cut = OUT.index("/a.md") + 3                      # inside the second invoke's first value
    r = c.chat.completions.create(model="capture-model", tools=TOOLS, max_tokens=cut,
                                  messages=[{"role": "user", "content": "WEATHER?"}]).choices[0]
    assert r.finish_reason == "length"
    assert [(t.function.name, json.loads(t.function.arguments)) for t in r.message.tool_calls] == \
        [WANT[0], ("Read", {"file_path": "/a."})]


def test_tiny_minimax_checkpoint_serves_a_tool_loop(tiny_dir, tmp_path):
    """A random-weight tiny MiniMax-M2 with the real template: the service picks the parser from
    the template, and a tool loop as an OpenAI client sends it (arguments as a JSON string)
    renders through the template and answers without markup in the text."""
    import openai
    from live_server import LiveServer

    from freetoken import LLM
    from freetoken.server.app import create_app
    from freetoken.server.server_state import ServerSettings
    from freetoken.server.generation import GenerationService
    d = tmp_path / "ckpt"
    shutil.copytree(tiny_dir("minimax_m2"), d)
    shutil.copy(TEMPLATE, d / "chat_template.jinja")
    llm = LLM(str(d), dtype="float32", max_model_len=4096, max_num_seqs=2, kv_cache_gib=0.1)
    svc = GenerationService(llm.engine, model_name="m", architecture="MiniMaxM2ForCausalLM", max_tokens_cap=16)
    assert svc.parser_cls is MiniMaxParser
    srv = LiveServer(create_app(svc, ServerSettings(model_names=["m"])))
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="k", max_retries=0)
        msgs = [{"role": "user", "content": "Read a.md"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "Read", "arguments": '{"file_path": "a.md", "limit": 3}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "# A"}]
        r = c.chat.completions.create(model="m", tools=TOOLS, messages=msgs, max_tokens=16).choices[0]
        for marker in ("<think>", "</think>", C, CC, "[e~[", "]~b]"):
            assert marker not in (r.message.content or "")
        assert r.finish_reason in ("stop", "length", "tool_calls")
    finally:
        srv.stop()
        llm.close()
