"""Semantic anchors on real chat templates rendered with real vocabularies: every marker
occurrence gives an anchor at the right token boundary, with the right kind, and
rendering is deterministic (volatile text late in a history leaves earlier tokens alone)."""
from __future__ import annotations

import pytest

from freetoken.engine.prefix.anchors import AnchorFinder, classify
from freetoken.tokenizer import Tokenizer

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a command",
                                           "parameters": {"type": "object", "properties": {
                                               "cmd": {"type": "string"}}, "required": ["cmd"]}}}]


def history(reminder: str = ""):
    call = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": {"cmd": "ls"}}}
    return [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test."},
        {"role": "assistant", "content": "", "reasoning_content": "Look at the files first.",
         "thinking": "Look at the files first.", "tool_calls": [call]},
        {"role": "tool", "content": "a.py\nb.py", "tool_call_id": "call_1", "name": "bash"},
        {"role": "assistant", "content": "The bug is in a.py.", "reasoning_content": "a.py is wrong.",
         "thinking": "a.py is wrong."},
        {"role": "user", "content": "Go on." + reminder},
    ]


# (vocab, template file, markers expected among the anchors' markers)
CASES = [
    ("qwen2", "Qwen-Qwen3-0.6B.jinja", {"<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                                        "<tool_response>", "</tool_response>"}),
    ("qwen35", "Qwen3.5-4B.jinja", {"<|im_start|>", "<|im_end|>", "<tool_call>", "<tool_response>"}),
    ("qwen2", "openai-gpt-oss-120b.jinja", {"<|start|>", "<|end|>", "<|call|>"}),
    ("deepseek-llm", "deepseek-ai-DeepSeek-V3.1.jinja", {"<｜User｜>", "<｜Assistant｜>",
                                                         "<｜tool▁calls▁begin｜>", "<｜tool▁output▁begin｜>"}),
    ("deepseek-llm", "deepseek-ai-DeepSeek-V4.jinja", {"<｜User｜>", "<｜Assistant｜>", "<｜DSML｜tool_calls>",
                                                       "<tool_result>"}),
    ("qwen2", "GLM-4.7-Flash.jinja", {"<|user|>", "<|assistant|>", "<tool_call>", "<|observation|>"}),
    ("qwen2", "MiniMax-M2.jinja", {"]~b]", "[e~[", "<minimax:tool_call>", "</minimax:tool_call>", "<response>",
                                   "</response>"}),
]


def token_bytes(finder, ids):
    return [finder.bytes_of(t) for t in ids]


def check_boundaries(finder, ids, anchors):
    """Each anchor sits at the token boundary next to its marker."""
    pieces = token_bytes(finder, ids)
    text = b"".join(pieces)
    for a in anchors:
        before = b"".join(pieces[:a.pos])
        m = a.marker.encode()
        closing = next(x.closing for x in finder.markers if x.text == a.marker)
        if closing:   # the marker ends inside the token just before pos
            lo = len(before) - len(pieces[a.pos - 1])
            assert any(text.startswith(m, s) for s in range(max(0, lo - len(m) + 1), len(before) - len(m) + 1)), a
        else:         # the marker starts inside the token at pos
            hi = len(before) + (len(pieces[a.pos]) if a.pos < len(pieces) else 0)
            assert any(text.startswith(m, s) for s in range(len(before), hi)), a


@pytest.mark.parametrize("vocab,template,expected", CASES, ids=[c[1] for c in CASES])
def test_anchors_on_real_templates(real_tokenizer_dir, vocab, template, expected):
    tok = Tokenizer(real_tokenizer_dir(vocab, template))
    finder = AnchorFinder.from_tokenizer(tok)
    text = tok.apply_chat_template(history(), tools=TOOLS)
    ids = tok.encode(text)
    anchors = finder.find(ids)
    assert expected <= {a.marker for a in anchors}, sorted({a.marker for a in anchors})
    assert [a.pos for a in anchors] == sorted({a.pos for a in anchors})
    assert all(0 < a.pos <= len(ids) for a in anchors)
    check_boundaries(finder, ids, anchors)
    kinds = {a.kind for a in anchors}
    assert {"turn", "tool_call", "tool_output"} <= kinds
    # every occurrence of every marker is anchored: count them in the text
    for m in finder.markers:
        n = text.count(m.text)
        got = sum(1 for a in anchors if a.marker == m.text)
        assert got <= n
    # incremental: anchors at or after `start` are the same as the tail of the full list
    mid = len(ids) // 2
    assert finder.positions(ids, start=mid) == [a.pos for a in anchors if a.pos >= mid]
    assert finder.positions(ids[:mid]) == [a.pos for a in anchors if a.pos <= mid and
                                           a.pos in finder.positions(ids[:mid])]


def test_single_token_markers_exact(real_tokenizer_dir):
    tok = Tokenizer(real_tokenizer_dir("qwen2", "Qwen-Qwen3-0.6B.jinja"))
    finder = AnchorFinder.from_tokenizer(tok)
    ids = tok.encode(tok.apply_chat_template(history(), tools=TOOLS))
    start, end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
    kinds = finder.kinds(ids)
    assert {i for i, t in enumerate(ids) if t == start and i > 0} <= set(kinds)
    assert {i + 1 for i, t in enumerate(ids) if t == end} <= set(kinds)
    call = tok.token_to_id("<tool_call>")
    resp = tok.token_to_id("<tool_response>")
    assert all(kinds[i] == "tool_call" for i, t in enumerate(ids) if t == call)
    assert all(kinds[i] == "tool_output" for i, t in enumerate(ids) if t == resp)


def test_thinking_in_generated_output(real_tokenizer_dir):
    """The model's own <think> ... </think> in an output: anchors before and after it."""
    tok = Tokenizer(real_tokenizer_dir("qwen2", "Qwen-Qwen3-0.6B.jinja"))
    finder = AnchorFinder.from_tokenizer(tok)
    out = tok.encode("<think>\nplan it\n</think>\n\nDone.<|im_end|>")
    kinds = finder.kinds(out)
    assert kinds.get(len(tok.encode("<think>\nplan it\n</think>"))) == "think"
    assert kinds.get(len(out)) == "turn"


def test_harmony_header_kinds(real_tokenizer_dir):
    tok = Tokenizer(real_tokenizer_dir("qwen2", "openai-gpt-oss-120b.jinja"))
    finder = AnchorFinder.from_tokenizer(tok)
    msgs = history()
    msgs[-1:] = []
    ids = tok.encode(tok.apply_chat_template(msgs, tools=TOOLS, add_generation_prompt=False))
    text = b"".join(token_bytes(finder, ids))
    pieces = token_bytes(finder, ids)
    heads = {}
    for a in finder.find(ids):
        if a.marker == "<|start|>":
            at = len(b"".join(pieces[:a.pos]))
            heads[text[at:text.index(b"<|message|>", at)].decode()] = a.kind
    assert any("<|start|>functions.bash" in h and k == "tool_output" for h, k in heads.items()), heads
    assert any("to=functions.bash" in h and k == "tool_call" for h, k in heads.items()), heads


def test_minimax_role_headers_and_dropped_thinking(real_tokenizer_dir):
    """MiniMax-M2 keeps the thinking of the turns after the last user message only: once a new
    user turn drops it, the last anchor on the shared prefix is the `]~b]` that opens that
    assistant turn (only its role header is recomputed); `]~b]tool` opens a tool output."""
    tok = Tokenizer(real_tokenizer_dir("qwen2", "MiniMax-M2.jinja"))
    finder = AnchorFinder.from_tokenizer(tok)
    loop = history()[:4]                                   # ... user, assistant (thinking, call), tool
    a = tok.encode(tok.apply_chat_template(loop, tools=TOOLS))
    b = tok.encode(tok.apply_chat_template(loop + [{"role": "assistant", "content": "Done."},
                                                   {"role": "user", "content": "Thanks."}], tools=TOOLS))
    kinds = finder.kinds(a)
    common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    last = max(p for p in kinds if p <= common)
    assert b"".join(finder.bytes_of(t) for t in a[last:common]).strip() == b"]~b]ai"
    assert "think" in {kinds[p] for p in kinds if common < p < common + 4}
    text = tok.apply_chat_template(loop, tools=TOOLS)
    assert text.count("<think>") == 2 and "]~b]tool" in text  # the kept thinking and the prompt's opener
    assert "tool_output" in {kinds[p] for p in kinds if p > common}


def test_tiny_checkpoint_template(tiny_dir):
    tok = Tokenizer(tiny_dir("qwen3_moe"))
    finder = AnchorFinder.from_tokenizer(tok)
    assert {m.text for m in finder.markers} >= {"<|im_start|>", "<|im_end|>", "<think>", "</think>",
                                                "<tool_call>", "</tool_call>", "<tool_response>"}
    ids = tok.encode(tok.apply_chat_template(history(), tools=TOOLS))
    check_boundaries(finder, ids, finder.find(ids))


@pytest.mark.parametrize("marker,kind,closing", [
    ("<|im_start|>", "turn", False), ("<|im_end|>", "turn", True), ("</think>", "think", True),
    ("<｜tool▁outputs▁begin｜>", "tool_output", False), ("<|turn>", "turn", False), ("<turn|>", "turn", True),
    ("<|call|>", "tool_call", True), ("<tools>", None, None), ("<|vision_start|>", None, None),
    ("<|fim_prefix|>", None, None), ("<arg_key>", None, None), ("]~b]", "turn", False), ("[e~[", "turn", True),
    ("<minimax:tool_call>", "tool_call", False), ("<tool>", None, None)])
def test_classify(marker, kind, closing):
    m = classify(marker)
    assert (m and (m.kind, m.closing)) == ((kind, closing) if kind else None)


@pytest.mark.parametrize("vocab,template", [("qwen2", "Qwen-Qwen3-0.6B.jinja"), ("qwen35", "Qwen3.5-4B.jinja"),
                                            ("qwen2", "openai-gpt-oss-120b.jinja"),
                                            ("deepseek-llm", "deepseek-ai-DeepSeek-V3.1.jinja"),
                                            ("qwen2", "GLM-4.7-Flash.jinja"), ("qwen2", "MiniMax-M2.jinja")])
def test_rendering_is_deterministic_and_late_reminders_keep_the_prefix(real_tokenizer_dir, vocab, template):
    """Issue item 4: the same history renders to the same tokens; `<system-reminder>` text
    appended to the last user message changes nothing before that message."""
    from freetoken.server.chat import render
    from freetoken.server.api.openai import openai_messages
    tok = Tokenizer(real_tokenizer_dir(vocab, template))
    wire = [dict(m) for m in history()]
    wire[2] = {"role": "assistant", "content": None,   # a client that sends no tool-call id
               "tool_calls": [{"type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}]}
    a = tok.encode(render(tok, openai_messages(wire), TOOLS))
    b = tok.encode(render(tok, openai_messages(wire), TOOLS))
    assert a == b
    wire2 = [dict(m) for m in wire]
    wire2[-1]["content"] += "\n<system-reminder>The date is 2026-11-30. Do not mention this.</system-reminder>"
    c = tok.encode(render(tok, openai_messages(wire2), TOOLS))
    # everything up to the last message's content is shared
    common = next((i for i, (x, y) in enumerate(zip(a, c)) if x != y), min(len(a), len(c)))
    text = render(tok, openai_messages(wire), TOOLS)
    k = len(tok.encode(text[:text.rindex("Go on.")]))
    assert common >= k - 1, (common, k)
