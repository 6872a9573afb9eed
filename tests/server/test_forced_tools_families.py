"""Forced tool calls end to end for families other than Qwen: a random-weight tiny checkpoint with
the family's real chat template copied in, served over HTTP, asked through the OpenAI, Anthropic
and Responses APIs to call a named tool or any tool. Random weights never write a call on their own;
under the family's forced-call grammar each answer is one call, to an allowed tool, whose
arguments (parsed back by the family's parser) satisfy the tool's schema."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from freetoken.server.parsers import DeepSeekParser, GlmParser, HarmonyParser, MiniMaxParser
from helpers import SHARED_DATA
from test_agent_forced_tools import satisfies

pytest.importorskip("llguidance", reason="constrained decoding needs llguidance")

HERE = Path(__file__).parent / "templates"
# (tiny architecture, HF architecture, chat template, the parser it picks)
FAMILIES = {
    "glm-4.6": ("glm4_moe", "Glm4MoeForCausalLM", HERE / "GLM-4.6.jinja", GlmParser),
    "minimax-m2": ("minimax_m2", "MiniMaxM2ForCausalLM", HERE / "MiniMax-M2.jinja", MiniMaxParser),
    "deepseek-v3.1": ("deepseek_v3", "DeepseekV3ForCausalLM",
                      SHARED_DATA / "chat-templates" / "deepseek-ai-DeepSeek-V3.1.jinja", DeepSeekParser),
    "gpt-oss": ("gpt_oss", "GptOssForCausalLM", SHARED_DATA / "chat-templates" / "openai-gpt-oss-120b.jinja",
                HarmonyParser),
}
# bounded values, so that random weights reach the end of the call within the token budget
READ = {"type": "object", "properties": {
    "file_path": {"type": "string", "maxLength": 16}, "limit": {"type": "integer", "minimum": 1, "maximum": 999},
    "flags": {"type": "object", "properties": {"raw": {"type": "boolean"}}, "required": ["raw"],
              "additionalProperties": False}},
    "required": ["file_path", "limit"], "additionalProperties": False}
GREP = {"type": "object", "properties": {"pattern": {"type": "string", "maxLength": 8}}, "required": ["pattern"],
        "additionalProperties": False}
SCHEMAS = {"Read": READ, "Grep": GREP}
USER = [{"role": "user", "content": "read the README"}]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def served(request, tiny_dir, tmp_path_factory):
    from live_server import LiveServer

    from freetoken import LLM
    from freetoken.server.app import create_app
    from freetoken.server.generation import GenerationService
    from freetoken.server.server_state import ServerSettings
    arch, hf_arch, template, parser = FAMILIES[request.param]
    if not template.is_file():
        pytest.skip(f"{template} is not checked out")
    d = tmp_path_factory.mktemp(request.param) / "ckpt"
    shutil.copytree(tiny_dir(arch), d)
    shutil.copy(template, d / "chat_template.jinja")
    llm = LLM(str(d), dtype="float32", max_model_len=8192, max_num_seqs=2, kv_cache_gib=0.2)
    svc = GenerationService(llm.engine, model_name="m", architecture=hf_arch, max_tokens_cap=None)
    assert svc.parser_cls is parser
    srv = LiveServer(create_app(svc, ServerSettings(model_names=["m"])))
    yield srv.url
    srv.stop()
    llm.close()


def check(name: str, args: dict, allowed: list[str]) -> None:
    assert name in allowed, name
    assert satisfies(args, SCHEMAS[name]), (name, args)


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "Grep"}}, "required"])
def test_openai_forced_call(served, choice):
    tools = [{"type": "function", "function": {"name": n, "description": n, "parameters": s}}
             for n, s in SCHEMAS.items()]
    r = httpx.post(served + "/v1/chat/completions", timeout=600, json={
        "model": "m", "max_tokens": 600, "seed": 3, "tools": tools, "tool_choice": choice, "messages": USER})
    assert r.status_code == 200, r.text[:300]
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "tool_calls", ch
    [call] = ch["message"]["tool_calls"]
    check(call["function"]["name"], json.loads(call["function"]["arguments"]),
          ["Grep"] if isinstance(choice, dict) else list(SCHEMAS))


@pytest.mark.parametrize("choice", [{"type": "tool", "name": "Read"}, {"type": "any"}])
def test_anthropic_forced_call(served, choice):
    tools = [{"name": n, "description": n, "input_schema": s} for n, s in SCHEMAS.items()]
    r = httpx.post(served + "/v1/messages", timeout=600, headers={"anthropic-version": "2023-06-01"}, json={
        "model": "m", "max_tokens": 600, "tools": tools, "tool_choice": choice, "messages": USER})
    assert r.status_code == 200, r.text[:300]
    body = r.json()
    assert body["stop_reason"] == "tool_use", body
    [use] = [b for b in body["content"] if b["type"] == "tool_use"]
    check(use["name"], use["input"], ["Read"] if choice["type"] == "tool" else list(SCHEMAS))


def test_responses_forced_call(served):
    tools = [{"type": "function", "name": n, "description": n, "parameters": s} for n, s in SCHEMAS.items()]
    r = httpx.post(served + "/v1/responses", timeout=600, json={
        "model": "m", "max_output_tokens": 600, "tools": tools, "tool_choice": {"type": "function", "name": "Read"},
        "input": "read the README"})
    assert r.status_code == 200, r.text[:300]
    [call] = [it for it in r.json()["output"] if it["type"] == "function_call"]
    check(call["name"], json.loads(call["arguments"]), ["Read"])
