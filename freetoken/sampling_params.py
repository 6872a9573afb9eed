"""Per-request sampling options, validated on construction."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .errors import InvalidRequestError

# Below this a temperature only sharpens an already one-hot distribution, and dividing
# fp32 logits by it overflows to inf (then NaN probabilities): clamp up to it.
MIN_TEMPERATURE = 1e-2
# The most alternatives a request may ask per token with `logprobs` (OpenAI chat's bound for
# top_logprobs; the completions API allows 5 there, we allow the same 20).
MAX_TOP_LOGPROBS = 20


@dataclass
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                      # 0 = off
    min_p: float = 0.0
    seed: int | None = None             # same seed + same prompt => same tokens
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    # None: no logprobs; k >= 0: each generated token's logprob under the raw model and the k
    # most likely tokens (StepOutput.logprobs; engine/logprobs.py)
    logprobs: int | None = None
    # Each: callable(output_token_ids: list[int], logits: Tensor[vocab] float32) -> Tensor.
    # Called before sampling; used for constrained decoding.
    logits_processors: list = field(default_factory=list)

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in (self.stop or []) if s]
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise InvalidRequestError(f"SamplingParams.{name}: got {v!r}, expected a finite number")
        for name in ("max_tokens", "top_k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise InvalidRequestError(f"SamplingParams.{name}: got {v!r}, expected an integer")
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int)
                                          or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS):
            raise InvalidRequestError(f"SamplingParams.logprobs: got {self.logprobs!r}, expected None or an "
                                      f"integer in [0, {MAX_TOP_LOGPROBS}]")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not -2**63 <= self.seed < 2**64):
            raise InvalidRequestError(f"SamplingParams.seed: got {self.seed!r}, expected an integer "
                                      "in [-2**63, 2**64)")
        checks = [
            ("max_tokens", self.max_tokens >= 1, "an integer >= 1"),
            ("temperature", 0.0 <= self.temperature <= 100.0, "a number in [0, 100]"),
            ("top_p", 0.0 < self.top_p <= 1.0, "a number in (0, 1]"),
            ("top_k", self.top_k >= 0, "an integer >= 0 (0 = off)"),
            ("min_p", 0.0 <= self.min_p <= 1.0, "a number in [0, 1]"),
            ("presence_penalty", -2.0 <= self.presence_penalty <= 2.0, "a number in [-2, 2]"),
            ("frequency_penalty", -2.0 <= self.frequency_penalty <= 2.0, "a number in [-2, 2]"),
            ("repetition_penalty", 0.01 <= self.repetition_penalty <= 10.0, "a number in [0.01, 10]"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise InvalidRequestError(f"SamplingParams.{name}: got {getattr(self, name)!r}, expected {expected}")
        if 0.0 < self.temperature < MIN_TEMPERATURE:
            self.temperature = MIN_TEMPERATURE

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
