"""A scripted stand-in for LLMEngine (same contract) so protocol tests can make the
"model" say exactly what a real model says: reasoning, tool calls, stop strings."""
from __future__ import annotations

import json
import threading
import time

import torch

from freetoken import SamplingParams
from freetoken.engine.llm_engine import StepOutput


# The scripted engine speaks the real contract: real request parameters, real step outputs.
FakeParams = SamplingParams


class FakeTokenizer:
    """One token per UTF-8 byte (id = byte + 1); id 0 is EOS."""
    eos_token_ids = {0}
    vocab_size = 257
    hf = None

    def encode(self, text: str) -> list[int]:
        return [b + 1 for b in text.encode()]

    def decode(self, ids, skip_special_tokens=False) -> str:
        return bytes(i - 1 for i in ids if 1 <= i <= 256).decode("utf-8", "replace")

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=True, **kw):
        s = ""
        if tools:
            s += "<|im_start|>system\n# Tools\n" + "\n".join(json.dumps(t) for t in tools) + "<|im_end|>\n"
        for m in messages:
            s += f"<|im_start|>{m['role']}\n"
            if m.get("reasoning_content"):
                s += f"<think>{m['reasoning_content']}</think>"
            s += m.get("content") or ""
            for c in m.get("tool_calls") or []:
                s += "<tool_call>" + json.dumps({"name": c["function"]["name"],
                                                  "arguments": c["function"]["arguments"]}) + "</tool_call>"
            s += "<|im_end|>\n"
        if add_generation_prompt:
            s += "<|im_start|>assistant\n"
            if kw.get("enable_thinking") is False:
                s += "<think>\n\n</think>\n\n"
        return s


class FakeEngine:
    """`scripts` maps a marker to an output; the marker that ends last in the prompt wins."""

    def __init__(self, scripts: dict[str, str] | None = None, max_model_len: int = 1 << 20,
                 chars_per_step: int = 3, step_delay: float = 0.0):
        self.tokenizer = FakeTokenizer()
        self.device = torch.device("cpu")      # no paged KV, no memory plan, nothing to resize, no preemption
        self.memory_plan = None
        self.max_model_len = max_model_len
        self.vocab_size = FakeTokenizer.vocab_size
        self.scripts = scripts or {}
        self.default = "Hello from the fake engine."
        self.chars_per_step = chars_per_step
        self.step_delay = step_delay
        self.seqs: dict[str, dict] = {}
        self.aborted: list[str] = []
        self.finished: list[str] = []
        self.added: list[tuple[str, object]] = []
        self.max_batch = 0
        self.thread_ids = set()

    def add_request(self, request_id, prompt_token_ids, params):
        self.thread_ids.add(threading.get_ident())
        if len(prompt_token_ids) + 1 > self.max_model_len:
            from freetoken.errors import PromptTooLongError
            raise PromptTooLongError("prompt too long")
        prompt = self.tokenizer.decode(prompt_token_ids)
        best, text = (-1, 0), self.default
        for marker, out in self.scripts.items():   # the last marker wins; of two ending at one
            i = prompt.rfind(marker)                # place (WEATHER? in AN_WEATHER?) the longer
            if i >= 0 and (i + len(marker), len(marker)) > best:
                best, text = (i + len(marker), len(marker)), out
        self.added.append((request_id, params))
        self.seqs[request_id] = {"text": text, "pos": 0, "params": params, "n": 0,
                                 "prompt": len(prompt_token_ids), "abort": False, "out": "",
                                 "emitted": 0}

    @property
    def capacity_tokens(self):
        return self.max_model_len

    def abort_request(self, request_id):
        if request_id in self.seqs:
            self.seqs[request_id]["abort"] = True

    def has_unfinished(self):
        return bool(self.seqs)

    def queue_lengths(self):
        return len(self.seqs), 0            # no KV limit: every request runs at once

    def step(self):
        self.thread_ids.add(threading.get_ident())
        if self.step_delay:
            time.sleep(self.step_delay)
        self.max_batch = max(self.max_batch, len(self.seqs))
        outs = []
        for rid, s in list(self.seqs.items()):
            p = s["params"]
            if s["abort"]:
                outs.append(StepOutput(rid, [], "", True, "abort", s["prompt"], s["n"]))
                self.aborted.append(rid)
                del self.seqs[rid]
                continue
            chunk = s["text"][s["pos"]:s["pos"] + self.chars_per_step]
            s["pos"] += len(chunk)
            ids = self.tokenizer.encode(chunk)
            reason = None
            room = p.max_tokens - s["n"]
            if len(ids) >= room:
                ids = ids[:room]
                chunk = self.tokenizer.decode(ids)
                reason = "length"
            s["n"] += len(ids)
            s["out"] += chunk
            hold = max((len(x) for x in p.stop or []), default=1) - 1
            hits = [(i, x) for i, x in ((s["out"].find(x), x) for x in p.stop or []) if i >= 0]
            stop_reason = 0 if reason is None and not hits and s["pos"] >= len(s["text"]) else None
            if hits:
                (end, stop_reason), reason = min(hits), "stop"
            elif reason is None and s["pos"] >= len(s["text"]):
                ids = ids + [0]
                s["n"] += 1
                reason = "stop"
            if reason and not hits:
                end = len(s["out"])
            elif not reason:
                end = max(s["emitted"], len(s["out"]) - hold)
            chunk = s["out"][s["emitted"]:end]
            s["emitted"] = end
            outs.append(StepOutput(rid, ids, chunk, reason is not None, reason, s["prompt"], s["n"], stop_reason))
            if reason:
                self.finished.append(rid)
                del self.seqs[rid]
        return outs

    def kv_usage(self):
        return None

    def on_preempt(self, listener):
        pass

    def memory_sizes(self):
        return {}

    def resize_memory(self, **sizes):
        from freetoken.errors import InvalidRequestError
        raise InvalidRequestError("the fake engine has no memory to resize")

    def pinned_bytes(self):
        return 0

    def close(self):
        pass                                   # no threads, no memory of its own

    def expert_stats(self):
        return {"backend": "fake", "total": {"hits": 7, "misses": 3, "bytes_copied": 1024},
                "per_layer": [{"hits": 4}, {"hits": 3}]}
