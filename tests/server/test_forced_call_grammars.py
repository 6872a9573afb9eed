"""Forced tool calls for every parser family: the grammar accepts exactly the text the family's
real chat template renders for a call (its markup tags as special tokens where the vocabulary has
them), rejects a wrong tool name, a missing required argument and a value of the wrong type; and
what the grammar lets a random model write parses back, through that family's parser, into one
call to an allowed tool whose arguments satisfy its schema."""
from __future__ import annotations

import json

import pytest
import torch

from freetoken.server.parsers import (DeepSeekParser, GlmParser, HarmonyParser, MiniMaxParser, QwenParser)
from freetoken.server.events import ToolCallEnd, ToolCallStart
from helpers import SHARED_DATA
from test_agent_forced_tools import satisfies

llguidance = pytest.importorskip("llguidance", reason="constrained decoding needs llguidance")

READ = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 12},
                                         "limit": {"type": "integer", "minimum": 1},
                                         "opts": {"type": "object", "properties": {"deep": {"type": "boolean"}},
                                                  "required": ["deep"], "additionalProperties": False},
                                         "mode": {"type": "string", "enum": ["a", "b c"]}},
        "required": ["path", "limit"], "additionalProperties": False}
SHELL = {"type": "object", "properties": {"cmd": {"type": "string", "maxLength": 8}}, "required": ["cmd"]}
CALLS = [("Read", READ), ("Shell", SHELL)]
ARGS = {"path": "a b.md\n</x>", "limit": 3, "opts": {"deep": True}, "mode": "b c"}

# (template file, parser, the vocabulary's special tokens, what the generation prompt ends with
#  that a rendered turn does not, what a rendered turn starts with that the model does not write,
#  what the model writes before the rendered turn, the end of turn)
FAMILIES = {
    "qwen3": ("Qwen-Qwen3-0.6B.jinja", QwenParser, [], "", "", "",
              "<|im_end|>\n"),
    "qwen3-coder": ("Qwen3-Coder.jinja", QwenParser, [], "", "", "", "<|im_end|>\n"),
    "deepseek-v3.1": ("deepseek-ai-DeepSeek-V3.1.jinja", DeepSeekParser,
                      ["<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
                       "<｜tool▁calls▁end｜>", "<｜end▁of▁sentence｜>"], "", "", "", "<｜end▁of▁sentence｜>"),
    "deepseek-v3.2": ("deepseek-ai-DeepSeek-V3.2.jinja", DeepSeekParser, ["<｜end▁of▁sentence｜>"],
                      "<think></think>", "</think>", "", "<｜end▁of▁sentence｜>"),   # the prompt's think block differs
    "deepseek-v4": ("deepseek-ai-DeepSeek-V4.jinja", DeepSeekParser, ["<｜end▁of▁sentence｜>"], "", "", "",
                    "<｜end▁of▁sentence｜>"),
    "glm-4.6": ("GLM-4.6.jinja", GlmParser, ["<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
                                             "<arg_value>", "</arg_value>"], "", "", "", ""),
    "glm-4.7": ("GLM-4.7-Flash.jinja", GlmParser, ["<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
                                                   "<arg_value>", "</arg_value>"], "", "", "", ""),
    "minimax-m2": ("MiniMax-M2.jinja", MiniMaxParser, ["<minimax:tool_call>", "</minimax:tool_call>"],
                   "<think>\n", "", "</think>\n\n", "[e~[\n"),
    "gpt-oss": ("openai-gpt-oss-120b.jinja", HarmonyParser, ["<|start|>", "<|channel|>", "<|message|>",
                                                            "<|constrain|>", "<|call|>", "<|end|>"], "", "", "", ""),
}


def family_tokenizer(tmp_path, template: str, specials: list[str]):
    """The tiny checkpoints' byte-level BPE, with the family's markup tags as special tokens."""
    from freetoken.tiny import train_tokenizer
    from freetoken.tokenizer import Tokenizer
    tok = train_tokenizer(512)
    tok.add_special_tokens(specials)
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "chat_template": template}))
    return Tokenizer(tmp_path)


@pytest.fixture(params=sorted(FAMILIES))
def family(request, tmp_path):
    file, parser, specials, *shape = FAMILIES[request.param]
    path = SHARED_DATA / "chat-templates" / file
    if not path.is_file():
        pytest.skip(f"{path} is not checked out")
    tok = family_tokenizer(tmp_path, path.read_text(), specials)
    from freetoken.server.grammar import build_tokenizer, forced_tool_call_grammar
    lltok = build_tokenizer(tok)
    from freetoken.server.chat import starts_in_reasoning
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                     enable_thinking=False, thinking=False)
    in_think = starts_in_reasoning(prompt)          # MiniMax-M2 opens one anyway
    return request.param, tok, lltok, parser, shape, \
        lambda calls: forced_tool_call_grammar(parser, calls, tok, lltok, in_think)


def rendered_call(tok, name: str, args: dict, shape, calls=CALLS) -> str:
    """What the model writes after the generation prompt for this call, as the template renders
    it in a past turn: the rendered conversation past the prompt, without the end of the turn."""
    tools = [{"type": "function", "function": {"name": n, "description": "d", "parameters": s}} for n, s in calls]
    user = [{"role": "user", "content": "read it"}]
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": name, "arguments": args}}]}
    prompt_tail, head, lead, end = shape
    kw = {"enable_thinking": False, "thinking": False}
    prompt = tok.apply_chat_template(user, tools=tools, add_generation_prompt=True, **kw)
    full = tok.apply_chat_template(user + [call], tools=tools, add_generation_prompt=False, **kw)
    base = prompt[:len(prompt) - len(prompt_tail)]
    assert prompt.endswith(prompt_tail) and full.startswith(base), (prompt[-80:], full[len(base) - 80:])
    turn = full[len(base):]
    assert turn.startswith(head) and turn.endswith(end), turn
    return lead + turn[len(head):len(turn) - len(end)]


def accepts(grammar: str, lltok, tok, text: str) -> bool:
    m = llguidance.LLMatcher(lltok, grammar)
    assert not m.is_error(), m.get_error()
    return all(m.consume_token(t) for t in tok.encode(text)) and not m.is_error() and m.is_accepting()


def test_the_grammar_accepts_the_templates_call_and_nothing_wrong(family):
    name, tok, lltok, parser, shape, grammar_of = family
    g = grammar_of(CALLS)
    text = rendered_call(tok, "Read", ARGS, shape)
    assert accepts(g, lltok, tok, text), text
    assert accepts(g, lltok, tok, rendered_call(tok, "Shell", {"cmd": "ls -l"}, shape))
    assert not accepts(grammar_of([("Shell", SHELL)]), lltok, tok, text)            # a tool not allowed
    missing = {k: v for k, v in ARGS.items() if k != "limit"}
    assert not accepts(g, lltok, tok, rendered_call(tok, "Read", missing, shape))
    assert not accepts(g, lltok, tok, rendered_call(tok, "Read", dict(ARGS, limit=[3]), shape))
    assert not accepts(g, lltok, tok, rendered_call(tok, "Read", dict(ARGS, opts={"deep": 1}), shape))
    assert not accepts(g, lltok, tok, rendered_call(tok, "Read", dict(ARGS, mode="d"), shape))
    assert not accepts(g, lltok, tok, rendered_call(tok, "Read", dict(ARGS, path="x" * 13), shape))   # maxLength
    # the parser reads the template's own call back as it was
    assert one_call(parser, text) == ("Read", ARGS)


def one_call(parser, text: str):
    p = parser([{"type": "function", "function": {"name": n, "parameters": s}} for n, s in CALLS])
    events = p.feed(text) + p.finish()
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    ends = [e for e in events if isinstance(e, ToolCallEnd)]
    assert len(starts) == len(ends) == 1, events
    return starts[0].name, json.loads(ends[0].arguments)


@pytest.mark.parametrize("seed", range(3))
def test_a_random_model_under_the_grammar_writes_one_valid_call(family, seed):
    """Random logits through GrammarProcessor, sampled until the grammar ends (or 600 tokens):
    the text parses into one call to an allowed tool with schema-valid arguments."""
    from freetoken.server.grammar import GrammarProcessor
    name, tok, lltok, parser, _, grammar_of = family
    eos = sorted(tok.eos_token_ids)
    proc = GrammarProcessor(lltok, grammar_of(CALLS), eos)
    g = torch.Generator().manual_seed(seed)
    out: list[int] = []
    for _ in range(600):
        logits = proc(out, torch.randn(tok.vocab_size, generator=g) * 3)
        t = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=g))
        if t in eos:
            break
        out.append(t)
    else:
        pytest.fail("the grammar never ended")
    called, args = one_call(parser, tok.decode(out))
    assert satisfies(args, dict(CALLS)[called]), (called, args)


def test_a_family_without_call_markup_is_refused(fake, monkeypatch):
    """Plain models (no tool-call markup in their template) still answer 400 naming tool_choice."""
    import httpx

    from freetoken.server.parsers import PlainParser
    _, url, svc = fake
    monkeypatch.setattr(svc, "parser_cls", PlainParser)
    tools = [{"type": "function", "function": {"name": "Shell", "parameters": SHELL}}]
    r = httpx.post(url + "/v1/chat/completions", timeout=30, json={
        "model": "capture-model", "max_tokens": 4, "tools": tools, "tool_choice": "required",
        "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "tool_choice" in r.text, r.text


def test_a_value_referring_to_the_schemas_definitions(family):
    """A parameter given by $ref (pydantic writes tool schemas so): the key/value forms write
    that value as JSON of the definition."""
    name, tok, lltok, parser, shape, grammar_of = family
    schema = {"type": "object", "$defs": {"Opts": {"type": "object", "properties": {"deep": {"type": "boolean"}},
                                                   "required": ["deep"], "additionalProperties": False}},
              "properties": {"opts": {"$ref": "#/$defs/Opts"}}, "required": ["opts"]}
    calls = [("Read", schema)]
    g = grammar_of(calls)
    text = rendered_call(tok, "Read", {"opts": {"deep": False}}, shape, calls)
    assert accepts(g, lltok, tok, text)
    assert not accepts(g, lltok, tok, rendered_call(tok, "Read", {"opts": {"deep": "no"}}, shape, calls))
    p = parser([{"type": "function", "function": {"name": "Read", "parameters": schema}}])
    got = [e for e in p.feed(text) + p.finish() if isinstance(e, ToolCallEnd)]
    assert [json.loads(e.arguments) for e in got] == [{"opts": {"deep": False}}]
