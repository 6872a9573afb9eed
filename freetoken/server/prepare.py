"""From a neutral chat (messages, tools, sampling fields) to a GenerationRequest:
render the template off the event loop, pick the family parser, build SamplingParams
(with grammar processors for JSON output and forced tool calls)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from .chat import check_tools, render, starts_in_reasoning
from .grammar import GrammarProcessor, check_grammar_size, forced_tool_call_grammar, json_schema_grammar
from .errors import BadRequest
from .generation import GenerationRequest, GenerationService
from .parsers import HarmonyParser, PlainParser

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
                   "frequency_penalty", "repetition_penalty", "ignore_eos", "stop_token_ids", "logprobs")


@dataclass
class ChatInput:
    messages: list[dict]
    endpoint: str
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None      # "auto" | "none" | "required" | {"name": NAME}
    max_tokens: int | None = None
    default_max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    sampling: dict = field(default_factory=dict)
    response_format: dict | None = None        # {"type": "json_schema", "schema"} | {"type": "json_object"}
    template_kwargs: dict = field(default_factory=dict)


def sampling_params(svc: GenerationService, max_tokens: int, stop: list[str], sampling: dict,
                    processors: list) -> object:
    """SamplingParams from the request's fields; fields it leaves out take the checkpoint's
    generation_config.json values (as vLLM does), then the engine's defaults."""
    kw = dict(svc.sampling_defaults)
    kw.update({k: v for k, v in sampling.items() if k in SAMPLING_FIELDS and v is not None})
    for k in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
              "repetition_penalty"):
        if k in kw and not isinstance(kw[k], (int, float)):
            raise BadRequest(f"{k}: expected a number, got {kw[k]!r}", param=k)
    if "temperature" in kw and not 0 <= kw["temperature"] <= 100:
        raise BadRequest(f"temperature must be >= 0, got {kw['temperature']}", param="temperature")
    if "top_p" in kw and not 0 < kw["top_p"] <= 1:
        raise BadRequest(f"top_p must be in (0, 1], got {kw['top_p']}", param="top_p")
    try:
        return svc.params_cls(max_tokens=max_tokens, stop=list(stop), logits_processors=processors,
                              **kw)
    except (ValueError, TypeError) as e:
        raise BadRequest(str(e)) from None


MAX_STOP_STRINGS = 64     # OpenAI allows 4; agents send a handful
MAX_STOP_CHARS = 256      # each one's length is also how much streamed text is held back


def _stop_list(stop) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise BadRequest("stop: expected a string or a list of strings", param="stop")
    if len(stop) > MAX_STOP_STRINGS:
        raise BadRequest(f"stop: {len(stop)} stop strings; this server accepts at most "
                         f"{MAX_STOP_STRINGS}", param="stop")
    long = next((s for s in stop if len(s) > MAX_STOP_CHARS), None)
    if long is not None:
        raise BadRequest(f"stop: a stop string of {len(long)} characters; at most "
                         f"{MAX_STOP_CHARS} each", param="stop")
    return [s for s in stop if s]


def _forced_tools(inp: ChatInput) -> list[dict] | None:
    """The tools a tool_choice forces the model to call, or None."""
    tc = inp.tool_choice
    if tc in (None, "auto", "none"):
        return None
    if not inp.tools:
        raise BadRequest(f"tool_choice {tc!r} needs tools, and the request has none",
                         param="tool_choice")
    if tc == "required":
        return inp.tools
    if isinstance(tc, dict) and tc.get("name"):
        chosen = [t for t in inp.tools if t["function"]["name"] == tc["name"]]
        if not chosen:
            raise BadRequest(f"tool_choice names {tc['name']!r}, which is not in tools",
                             param="tool_choice")
        return chosen
    raise BadRequest(f"tool_choice: unsupported value {tc!r}", param="tool_choice")


async def prepare_chat(svc: GenerationService, inp: ChatInput) -> GenerationRequest:
    tools = inp.tools or None
    if tools:
        check_tools(tools)
    if inp.tool_choice == "none":
        tools = None
    forced = _forced_tools(inp)
    parser_cls = svc.parser_cls
    kwargs = dict(inp.template_kwargs)
    grammar = None
    json_out = inp.response_format and inp.response_format.get("type") in ("json_schema", "json_object")
    if json_out and parser_cls is HarmonyParser:
        raise BadRequest("response_format json_schema/json_object is not supported yet for harmony "
                         "(gpt-oss) models", param="response_format")
    if forced and not json_out and not parser_cls.forced_calls:
        raise BadRequest(f"tool_choice {inp.tool_choice!r} needs constrained tool calls, and this model's "
                         f"chat format ({parser_cls.__name__}) has no tool-call markup; use 'auto'",
                         param="tool_choice")
    # grammars compile in a worker thread: a large schema must not stall every stream
    if json_out:
        schema = inp.response_format.get("schema") if inp.response_format["type"] == "json_schema" else None
        check_grammar_size(schema, "response_format.json_schema.schema")
        grammar = await asyncio.to_thread(json_schema_grammar, schema)
        kwargs.setdefault("enable_thinking", False)
    elif forced:
        calls = [(t["function"]["name"], t["function"].get("parameters")) for t in forced]
        check_grammar_size(calls, "tools")
        kwargs.setdefault("enable_thinking", False)
    elif inp.response_format and inp.response_format.get("type") not in (None, "text"):
        raise BadRequest(f"response_format type {inp.response_format.get('type')!r} is not "
                         "supported (use text, json_object or json_schema)", param="response_format")

    prompt = await asyncio.to_thread(render, svc.tokenizer, inp.messages, tools, kwargs)
    if forced and not json_out:
        # after the render: a template that opens a think block anyway (MiniMax-M2) has the
        # grammar close it first
        lltok = await asyncio.to_thread(svc.grammar_tokenizer)
        grammar = await asyncio.to_thread(forced_tool_call_grammar, parser_cls, calls, svc.tokenizer, lltok,
                                          starts_in_reasoning(prompt))
    ids = await asyncio.to_thread(svc.encode_prompt, prompt)
    max_tokens, window_limited = svc.output_budget(inp.max_tokens, len(ids), inp.default_max_tokens)
    processors = []
    if grammar is not None:
        lltok = await asyncio.to_thread(svc.grammar_tokenizer)
        where = "response_format.json_schema.schema" if json_out else "tools"
        processors.append(await asyncio.to_thread(GrammarProcessor, lltok, grammar, svc.eos_ids, where))
    stop = _stop_list(inp.stop)
    params = sampling_params(svc, max_tokens, stop, inp.sampling, processors)
    reasoning = starts_in_reasoning(prompt) and grammar is None
    parser = PlainParser() if json_out else parser_cls(tools, reasoning=reasoning)
    return GenerationRequest(ids, params, inp.endpoint, parser=parser, tools=bool(tools), stop=stop,
                             window_limited=window_limited)


async def prepare_text(svc: GenerationService, prompt: str | list[int], *, endpoint: str,
                       max_tokens: int | None, stop, sampling: dict) -> GenerationRequest:
    if isinstance(prompt, str):
        ids = await asyncio.to_thread(svc.encode_prompt, prompt)
    else:
        ids = list(prompt)
        vocab = getattr(svc.tokenizer, "vocab_size", None)
        bad = next((t for t in ids if not 0 <= t < (vocab or 1 << 62)), None)
        if bad is not None:
            raise BadRequest(f"prompt: token id {bad} is outside the vocabulary [0, {vocab})",
                             param="prompt")
    if not ids:
        raise BadRequest("prompt is empty", param="prompt")
    n, window_limited = svc.output_budget(max_tokens, len(ids), 16)
    stop = _stop_list(stop)
    params = sampling_params(svc, n, stop, sampling, [])
    return GenerationRequest(ids, params, endpoint, parser=PlainParser(), stop=stop,
                             window_limited=window_limited)
