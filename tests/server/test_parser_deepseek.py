"""DeepSeek tool-call and reasoning parsing: the three tool-call forms (V3/V3.1 special
tokens, V3-0324/R1 fenced JSON, V3.2/V4 DSML blocks), split at every chunk boundary, and
round trips through the real DeepSeek chat templates (what the template renders for an
assistant turn parses back to the same calls)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from freetoken.server.parsers import DeepSeekParser, parser_for
from freetoken.tokenizer import Tokenizer

TEMPLATES = Path(__file__).parent / "data"      # the real DeepSeek templates (see data/README.md)

from test_server_parsers import TOOLS, run, splits

B, E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CB, CE, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
D = "｜DSML｜"

CASES = [
    # (output, starts in reasoning, text, reasoning, calls)
    (f'Let me check.{B}{CB}get_weather{SEP}{{"city": "Paris"}}{CE}{CB}Read{SEP}{{"file_path": "/a b.md", '
     f'"limit": 3}}{CE}{E}<｜end▁of▁sentence｜>', False, "Let me check.", "",
     [("get_weather", {"city": "Paris"}), ("Read", {"file_path": "/a b.md", "limit": 3})]),
    (f"The user asks for Oslo.\n</think>\n\n{B}{CB}function{SEP}get_weather\n```json\n"
     f'{{"city": "Oslo"}}\n```{CE}{E}', True, "", "The user asks for Oslo.", [("get_weather", {"city": "Oslo"})]),
    (f'Thinking hard.</think>Done: a <b>tag</b> and 3 < 4.<｜end▁of▁sentence｜>', True,
     "Done: a <b>tag</b> and 3 < 4.", "Thinking hard.", []),
    (f"I'll read it.\n\n<{D}tool_calls>\n<{D}invoke name=\"Read\">\n"
     f'<{D}parameter name="file_path" string="true">/home/u/README.md</{D}parameter>\n'
     f'<{D}parameter name="limit" string="false">20</{D}parameter>\n'
     f'<{D}parameter name="opts" string="false">{{"raw": true}}</{D}parameter>\n</{D}invoke>\n'
     f'<{D}invoke name="get_weather">\n<{D}parameter name="city" string="true">São Paulo</{D}parameter>\n'
     f"</{D}invoke>\n</{D}tool_calls>", False, "I'll read it.", "",
     [("Read", {"file_path": "/home/u/README.md", "limit": 20, "opts": {"raw": True}}),
      ("get_weather", {"city": "São Paulo"})]),
    (f'Plan.</think>\n\n<{D}function_calls>\n<{D}invoke name="get_weather">\n'
     f'<{D}parameter name="city" string="true">Rome</{D}parameter>\n</{D}invoke>\n</{D}function_calls>', True,
     "", "Plan.", [("get_weather", {"city": "Rome"})]),
    (f"{B}{CB}get_weather{SEP}not json{CE}{E}Sorry.", False, "Sorry.", "", []),
    (f'{CB}get_weather{SEP}"{{\\"city\\": \\"Lima\\"}}"{CE}', False, "", "", [("get_weather", {"city": "Lima"})]),
]


@pytest.mark.parametrize("case", CASES, ids=[f"deepseek{i}" for i in range(len(CASES))])
def test_deepseek_every_split(case):
    out, reasoning_start, text, reasoning, calls = case
    for pieces in splits(out):
        got = run(DeepSeekParser(TOOLS, reasoning=reasoning_start), pieces)
        assert got == (text, reasoning, calls), pieces


def test_parser_for_deepseek():
    assert parser_for("DeepseekV3ForCausalLM") is DeepSeekParser
    assert parser_for("DeepseekV32ForCausalLM") is DeepSeekParser
    assert parser_for("DeepseekV4ForCausalLM") is DeepSeekParser
    for name in ("V3.1", "V3.2", "V4", "V4-Flash-0731"):
        template = (TEMPLATES / f"deepseek-ai-DeepSeek-{name}.jinja").read_text()
        assert parser_for("DeepseekV3ForCausalLM", template) is DeepSeekParser


@pytest.mark.parametrize("name", ["V3.1", "V3.2", "V4", "V4-Flash-0731"])
def test_real_template_round_trip(tiny_dir, tmp_path, name):
    """The assistant turn the real template renders parses back to the same calls."""
    d = tmp_path / "tok"
    d.mkdir()
    shutil.copy(tiny_dir("qwen3_moe") / "tokenizer.json", d)
    template = (TEMPLATES / f"deepseek-ai-DeepSeek-{name}.jinja").read_text()
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    calls = [("get_weather", {"city": "Paris"}), ("Read", {"file_path": "/tmp/x.py", "limit": 5})]
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "On it.", "tool_calls": [
                {"id": f"c{i}", "type": "function",
                 "function": {"name": n, "arguments": json.dumps(a) if name == "V3.1" else a}}
                for i, (n, a) in enumerate(calls)]},
            {"role": "tool", "tool_call_id": "c0", "content": "sunny"},
            {"role": "tool", "tool_call_id": "c1", "content": "print(1)"}]
    prompt = Tokenizer(d).apply_chat_template(msgs, tools=TOOLS, add_generation_prompt=False)
    turn = prompt.split("<｜Assistant｜>", 1)[1].split("<｜end▁of▁sentence｜>")[0]
    assert turn.count("Paris") == 1
    for pieces in (list(turn), [turn]):
        text, reasoning, got = run(DeepSeekParser(TOOLS), pieces)
        assert got == calls and text == "On it." and reasoning == ""
