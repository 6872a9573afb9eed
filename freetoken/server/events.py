"""Neutral generation events: what both HTTP adapters turn into their own wire format."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TextDelta:
    text: str


@dataclass
class ReasoningDelta:
    text: str


@dataclass
class ToolCallStart:
    index: int
    id: str          # "call_<hex>"; the Anthropic adapter rewrites the prefix
    name: str


@dataclass
class ToolCallDelta:
    index: int
    arguments: str   # a piece of the JSON arguments text


@dataclass
class ToolCallEnd:
    index: int
    arguments: str   # the whole JSON arguments text


@dataclass
class Done:
    finish_reason: str              # "stop" | "length" | "tool_calls" | "abort" | "error" | "constraint_failed"
    # (constraint_failed: a response_format / forced-call grammar could not be completed; error says why)
    prompt_tokens: int
    completion_tokens: int
    stop_sequence: str | None = None
    error: str | None = None
    cached_tokens: int = 0          # prompt tokens served from the prefix cache (not recomputed)
    context_full: bool = False      # "length" because the context window is full, not max_tokens


Event = TextDelta | ReasoningDelta | ToolCallStart | ToolCallDelta | ToolCallEnd | Done
