"""What the layers above the engine may call on one, and what they get back (`StepOutput`,
`KVUsage`).

`LLMEngine` implements it; the server's tests run a scripted fake against the same
protocol. Errors cross the seam as exception types from `freetoken.errors`
(`InvalidRequestError`, `PromptTooLongError`), caught by type, never by name. The server,
`LLM`, the CLI, the simulators and the benchmarks use no other name of the engine object
(tests/test_private_names.py checks it; `client_names()` lists them)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol, runtime_checkable

import torch

from ..sampling_params import SamplingParams
from .llm_engine import KVUsage, StepOutput

if TYPE_CHECKING:
    from ..memory.plan import MemoryPlan


@runtime_checkable
class EngineClient(Protocol):
    tokenizer: object
    max_model_len: int          # the model's context window
    vocab_size: int             # token ids a prompt may hold: [0, vocab_size)
    capacity_tokens: int        # tokens the KV cache holds (a request may use min of the two)
    device: torch.device        # where the model runs (the memory watcher reads that device's free memory)
    memory_plan: MemoryPlan | None   # the start-up plan (memory/plan.py); None: the engine made none

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    want_prompt_logits: bool = False) -> None:
        """Queue a request; raises InvalidRequestError / PromptTooLongError (to that request only).
        want_prompt_logits: its last StepOutput carries the prompt's logits (`LLM.score`)."""

    def abort_request(self, request_id: str) -> None:
        """Finish a request now; its last StepOutput says finish_reason "abort"."""

    def step(self) -> list[StepOutput]:
        """One scheduler iteration: the new tokens/text of every running request."""

    def has_unfinished(self) -> bool: ...

    def queue_lengths(self) -> tuple[int, int]:
        """(running, waiting) requests: the scheduler alone admits a request to run."""

    def kv_usage(self) -> KVUsage | None:
        """The KV pool's blocks now (None: the engine has no paged KV)."""

    def on_preempt(self, listener: Callable[[str], None]) -> None:
        """listener(request_id) is called for every preempted request."""

    def expert_stats(self) -> dict:
        """Expert-memory counters for /metrics ({} when the engine has none)."""

    def memory_sizes(self) -> dict:
        """Bytes of every resizable component now: {"expert_cache"|"kv_cache"|"state_cache":
        {"bytes", "device", ...} or None} ({} when nothing is resizable)."""

    def resize_memory(self, *, expert_cache_gib: float | None = None, kv_cache_gib: float | None = None,
                      state_cache_gib: float | None = None, host_cache_gib: float | None = None,
                      allow_preempt: bool = True,
                      trigger: str = "api") -> dict:
        """Grow or shrink those components between steps; raises InvalidRequestError for a bad size."""

    def pinned_bytes(self) -> int:
        """Host bytes page-locked in place now."""

    def close(self) -> None:
        """Release the engine's worker threads and expert memory (it takes no more requests)."""


def client_names() -> frozenset[str]:
    """Every name EngineClient declares: what may be read on an engine object."""
    methods = {n for n, v in vars(EngineClient).items() if callable(v) and not n.startswith("_")}
    return frozenset(methods | set(EngineClient.__annotations__))


__all__ = ["EngineClient", "KVUsage", "StepOutput", "client_names"]
