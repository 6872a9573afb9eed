"""What the server may call on an engine, and what it gets back (`StepOutput`).

`LLMEngine` implements it; the server's tests run a scripted fake against the same
protocol. Errors cross the seam as exception types from `freetoken.errors`
(`InvalidRequestError`, `PromptTooLongError`), caught by type, never by name."""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..sampling_params import SamplingParams
from .llm_engine import StepOutput


@runtime_checkable
class EngineClient(Protocol):
    tokenizer: object
    max_model_len: int          # the model's context window
    capacity_tokens: int        # tokens the KV cache holds (a request may use min of the two)

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Queue a request; raises InvalidRequestError / PromptTooLongError (to that request only)."""

    def abort_request(self, request_id: str) -> None:
        """Finish a request now; its last StepOutput says finish_reason "abort"."""

    def step(self) -> list[StepOutput]:
        """One scheduler iteration: the new tokens/text of every running request."""

    def has_unfinished(self) -> bool: ...

    def queue_lengths(self) -> tuple[int, int]:
        """(running, waiting) requests: the scheduler alone admits a request to run."""

    def expert_stats(self) -> dict:
        """Expert-memory counters for /metrics ({} when the engine has none)."""


__all__ = ["EngineClient", "StepOutput"]
