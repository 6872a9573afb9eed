"""The stable Python API: `LLM(model_dir, ...).generate(...)` and `.score(...)`."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from .config import EngineConfig
from .engine.llm_engine import LLMEngine
from .sampling_params import SamplingParams


@dataclass
class Completion:
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    num_cached_tokens: int = 0       # prompt tokens served from the prefix cache


class LLM:
    def __init__(self, model: str, dtype: str = "bfloat16", **engine_options):
        self.engine = LLMEngine(EngineConfig.from_options(model, dtype=dtype, **engine_options))
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def generate(self, prompts: list[str | list[int]] | str, params: SamplingParams | None = None,
                 use_chat_template: bool = False) -> list[Completion]:
        """All prompts are batched together by the engine; results come back in prompt order."""
        params = params or SamplingParams()
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        order, results, errors = [], {}, {}
        token_lists = {}
        for p in prompts:
            if isinstance(p, str) and use_chat_template:
                p = self.tokenizer.apply_chat_template([{"role": "user", "content": p}])
            ids = self.tokenizer.encode(p) if isinstance(p, str) else list(p)
            rid = f"gen-{next(self._ids)}"
            self.engine.add_request(rid, ids, params)
            order.append(rid)
            token_lists[rid] = ids
            results[rid] = ([], [])
        while self.engine.has_unfinished():
            for out in self.engine.step():
                toks, texts = results[out.request_id]
                toks.extend(out.new_token_ids)
                texts.append(out.new_text)
                if out.finished:
                    results[out.request_id] = (toks, texts, out.finish_reason, out.num_cached_tokens)
                    errors[out.request_id] = getattr(out, "error", None)
        failed = next((r for r in order if errors.get(r)), None)
        if failed:                  # the other prompts ran to the end; this one's work raised
            raise RuntimeError(f"request {failed} failed in the engine: {errors[failed]}")
        return [Completion(token_lists[r], results[r][0], "".join(results[r][1]), results[r][2], results[r][3])
                for r in order]

    def score(self, token_ids: list[int]) -> torch.Tensor:
        """float32 logits [len(token_ids), vocab] for every position, via the normal prefill path."""
        rid = f"score-{next(self._ids)}"
        self.engine.add_request(rid, list(token_ids), SamplingParams(max_tokens=1, temperature=0.0),
                                want_prompt_logits=True)
        logits = None
        while self.engine.has_unfinished():
            for out in self.engine.step():
                if out.request_id == rid and getattr(out, "error", None):
                    raise RuntimeError(f"scoring failed in the engine: {out.error}")
                if out.request_id == rid and out.prompt_logits is not None:
                    logits = out.prompt_logits
        if logits is None:
            raise RuntimeError(f"scoring: the engine ended request {rid} without its prompt logits")
        return logits[: len(token_ids)]

    def expert_stats(self) -> dict:
        return self.engine.expert_stats()

    def close(self) -> None:
        self.engine.close()
