"""Tokenizer round trips and chat templates rendered in the sandbox."""
from __future__ import annotations

import json

import pytest

from freetoken.errors import CheckpointError

from freetoken.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok(tiny_dir):
    return Tokenizer(tiny_dir("qwen3_moe"))


def test_round_trip_and_specials(tok):
    text = 'def f(x):\n    return {"a": 1} # ünïcode ✓'
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode("<|im_end|>") == [tok.token_to_id("<|im_end|>")]
    assert tok.token_to_id("<|im_end|>") in tok.eos_token_ids


def test_chat_template_with_tools_thinking_and_tool_results(tok):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "weather in Paris?"}]},
        {"role": "assistant", "content": None, "reasoning_content": "need the tool",
         "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny"},
    ]
    out = tok.apply_chat_template(messages, tools=tools, enable_thinking=False)
    assert out.startswith("<|im_start|>system\nbe brief\n\n# Tools")
    assert json.dumps(tools[0], ensure_ascii=False) in out
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in out
    assert "<tool_response>\nsunny\n</tool_response><|im_end|>" in out
    assert "<think>\nneed the tool\n</think>" in out
    assert out.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]).endswith("<|im_start|>assistant\n")


def test_template_sandbox_blocks_attribute_escape(tmp_path, tiny_dir):
    import shutil
    d = tmp_path / "evil"
    shutil.copytree(tiny_dir("qwen3_moe"), d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="cannot be rendered safely"):   # refused at load, one line
        Tokenizer(d)


def test_chat_template_file_takes_precedence(tmp_path, tiny_dir):
    import shutil
    d = tmp_path / "file"
    shutil.copytree(tiny_dir("qwen3_moe"), d)
    (d / "chat_template.jinja").write_text("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}")
    assert Tokenizer(d).apply_chat_template([{"role": "user", "content": "x"}]) == "[user]x"
