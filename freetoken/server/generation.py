"""The neutral generation layer under both HTTP adapters: submit a rendered prompt to
the engine thread, turn its StepOutputs into neutral events with the model family's
parser, and account usage, finish reasons, metrics and the per-request log line."""
from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator

from ..errors import PromptTooLongError
from ..sampling_params import SamplingParams
from .engine_loop import EngineLoop, Job
from .errors import BadRequest, ContextOverflow, Overloaded
from .events import Done, Event, ToolCallDelta, ToolCallEnd, ToolCallStart
from .operations.metrics import Metrics
from .parsers import Parser, PlainParser, parser_for
from .grammar import build_tokenizer
from .prompt_tokens import encode_bounded

log = logging.getLogger("freetoken.server")


@dataclass
class GenerationRequest:
    """What an adapter asks for, after it has rendered its prompt."""
    prompt_ids: list[int]
    params: object                     # engine SamplingParams
    endpoint: str                      # for logs and metrics: "chat", "messages", ...
    parser: Parser = field(default_factory=PlainParser)
    tools: bool = False                # the request offered tools: keep tool-call events
    max_tool_calls: int | None = None  # parallel_tool_calls=false: keep only the first call
    stop: list[str] = field(default_factory=list)
    window_limited: bool = False       # the output budget is the room left in the context window
    want_prompt_logits: bool = False   # echo with logprobs: the engine returns the prompt's logits


class Generation:
    """One submitted request: iterate `events()`; closing it early aborts the request."""

    _ids = itertools.count()

    def __init__(self, service: "GenerationService", req: GenerationRequest):
        self.service = service
        self.req = req
        self.request_id = f"{req.endpoint}-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        self.token_ids: list[int] = []
        self.finished = False
        self.accounted = False         # metrics and the log line have seen this request
        self.cached_tokens = 0         # prompt tokens the prefix cache served (known from the first output)
        self.logprobs: list = []       # params.logprobs: a TokenLogprob per generated token
        self.prompt_logits = None      # want_prompt_logits: [prompt, vocab] once it finished
        self.job = Job(self.request_id, req.prompt_ids, req.params, asyncio.get_running_loop(),
                       want_prompt_logits=req.want_prompt_logits)
        service.loop.submit(self.job)

    def abort(self) -> None:
        if not self.finished:
            self.finished = True
            self.service.loop.abort(self.request_id)

    async def events(self) -> AsyncIterator[Event]:
        req, m = self.req, self.service.metrics
        parser = req.parser
        first = None
        n_calls = 0
        try:
            while True:
                out = await self.job.outputs.get()
                self.job.last_read = time.monotonic()
                if isinstance(out, Exception):
                    self.finished = self.accounted = True
                    if isinstance(out, PromptTooLongError):
                        raise ContextOverflow(len(req.prompt_ids), self.service.max_model_len)
                    if isinstance(out, ValueError):
                        raise BadRequest(str(out))
                    if isinstance(out, Overloaded):
                        raise out
                    m.requests.labels(req.endpoint, "error").inc()
                    yield Done("error", len(req.prompt_ids), len(self.token_ids), error=str(out))
                    return
                self.cached_tokens = out.num_cached_tokens
                if first is None and out.new_token_ids:
                    first = time.monotonic()
                self.token_ids += out.new_token_ids
                if getattr(out, "logprobs", None):
                    self.logprobs += out.logprobs
                if getattr(out, "prompt_logits", None) is not None:
                    self.prompt_logits = out.prompt_logits
                events = parser.feed(out.new_text) if out.new_text else []
                if out.finished:
                    self.finished = True
                    events += parser.finish(truncated=out.finish_reason == "length")
                for ev in events:
                    if isinstance(ev, (ToolCallStart, ToolCallDelta, ToolCallEnd)):
                        if not req.tools or (req.max_tool_calls is not None
                                             and ev.index >= req.max_tool_calls):
                            continue
                        n_calls += isinstance(ev, ToolCallStart)
                    yield ev
                if out.finished:
                    done = self._done(out, n_calls, first)
                    yield done
                    return
        finally:
            if not self.accounted:     # the client left (stream closed or request cancelled)
                self.abort()
                self._count_cancelled(first)

    def _count_cancelled(self, first: float | None) -> None:
        """A request the client left still costs its prefill and the tokens made so far."""
        m, req = self.service.metrics, self.req
        self.accounted = True
        m.requests.labels(req.endpoint, "cancelled").inc()
        m.generation_tokens.inc(len(self.token_ids))
        if first is not None:
            m.ttft.observe(first - self.job.submitted)
            m.prompt_tokens.inc(len(req.prompt_ids))
        log.info("req=%s cancelled by the client after %d tokens", self.request_id,
                 len(self.token_ids))

    def _done(self, out, n_calls: int, first: float | None) -> Done:
        m, req = self.service.metrics, self.req
        self.accounted = True
        reason = out.finish_reason or "stop"
        stop_seq = None
        if reason == "stop" and n_calls:
            reason = "tool_calls"
        elif reason == "stop" and isinstance(out.stop_reason, str):
            stop_seq = out.stop_reason
        procs = getattr(req.params, "logits_processors", ())
        if out.finish_reason == "stop" and not isinstance(out.stop_reason, str):
            for p in procs:                 # ended on a stop token: did the grammar accept it whole?
                if hasattr(p, "ended_on_stop_token"):
                    p.ended_on_stop_token(self.token_ids)
        failed = next((p.failed for p in procs if getattr(p, "failed", None)), None)
        if failed and reason in ("stop", "tool_calls"):   # a grammar ended it unfinished: never "stop"
            reason = "constraint_failed"
        now = time.monotonic()
        prompt_tokens = out.prompt_tokens or len(req.prompt_ids)
        completion = out.completion_tokens or len(self.token_ids)
        ttft = (first or now) - self.job.submitted
        tps = (completion - 1) / (now - first) if first and completion > 1 and now > first else 0.0
        if first:
            m.ttft.observe(ttft)
        if tps:
            m.decode_tps.observe(tps)
        m.e2e.observe(now - self.job.submitted)
        m.prompt_tokens.inc(prompt_tokens)
        m.generation_tokens.inc(completion)
        m.requests.labels(req.endpoint, reason).inc()
        m.record_request(req.endpoint, reason, prompt_tokens, out.num_cached_tokens, completion,
                         ttft if first else None, tps)
        log.info("req=%s %s prompt=%d cached=%d completion=%d ttft=%.3fs decode=%.1f tok/s finish=%s",
                 self.request_id, req.endpoint, prompt_tokens, out.num_cached_tokens, completion,
                 ttft, tps, reason)
        return Done(reason, prompt_tokens, completion, stop_sequence=stop_seq, cached_tokens=out.num_cached_tokens,
                    error=failed if reason == "constraint_failed" else None,
                    context_full=reason == "length" and req.window_limited)


class GenerationService:
    """Owns the engine thread; adapters render prompts with it and submit requests."""

    def __init__(self, engine, *, model_name: str, architecture: str | None = None,
                 max_running: int = 16, max_waiting: int = 256, max_tokens_cap: int | None = None,
                 strict_max_tokens: bool = False, metrics: Metrics | None = None,
                 params_cls=None, sampling_defaults: dict | None = None,
                 stall_timeout: float = 30.0):
        if params_cls is None:
            params_cls = SamplingParams
        self.params_cls = params_cls
        self.sampling_defaults = dict(sampling_defaults or {})
        self.engine = engine
        self.tokenizer = engine.tokenizer
        # the context a request may use: the window, or less when the KV cache is smaller
        self.max_model_len = int(min(engine.max_model_len,
                                     engine.capacity_tokens))
        self.model_name = model_name
        self.architecture = architecture
        self.parser_cls = parser_for(architecture, getattr(self.tokenizer, "chat_template", None))
        self.max_tokens_cap = max_tokens_cap
        self.strict_max_tokens = strict_max_tokens
        self.eos_ids = set(getattr(self.tokenizer, "eos_token_ids", ()) or ())
        self.metrics = metrics or Metrics()
        self.loop = EngineLoop(engine, max_running, max_waiting, self.metrics, stall_timeout)
        self._grammar_tokenizer = None
        self._grammar_lock = threading.Lock()

    def start(self) -> None:
        self.loop.start()

    def stop(self) -> None:
        self.loop.stop()

    def max_tokens_for(self, requested: int | None, n_prompt: int, default: int | None = None) -> int:
        """Output budget: the request's (or the default) bounded by the context window."""
        return self.output_budget(requested, n_prompt, default)[0]

    def output_budget(self, requested: int | None, n_prompt: int,
                      default: int | None = None) -> tuple[int, bool]:
        """(output budget, whether it is the room left in the window rather than what the
        request or the server's cap asked for): a stop there is "the context is full"."""
        room = self.max_model_len - n_prompt
        if room < 1:
            raise ContextOverflow(n_prompt, self.max_model_len)
        if requested is not None and requested < 1:
            raise BadRequest(f"max_tokens must be at least 1, got {requested}", param="max_tokens")
        if requested is not None and requested > room and self.strict_max_tokens:
            raise BadRequest(
                f"max_tokens is too large: {requested}. The prompt is {n_prompt} tokens and the "
                f"context window {self.max_model_len}, so at most {room} tokens can be generated",
                param="max_tokens")
        n = requested if requested is not None else (default or room)
        if self.max_tokens_cap:
            n = min(n, self.max_tokens_cap)
        return max(1, min(n, room)), n > room or (requested is None and not default)

    @property
    def max_output_tokens(self) -> int:
        """The most tokens one reply may have: the server's cap, else the whole window."""
        return min(self.max_tokens_cap or self.max_model_len, self.max_model_len - 1)

    def encode_prompt(self, text: str) -> list[int]:
        """The prompt's ids, or ContextOverflow after tokenizing at most about the window's
        worth of it (call it off the event loop)."""
        ids, n = encode_bounded(self.tokenizer, text, self.max_model_len)
        if ids is None:
            self.max_tokens_for(None, n)     # raises ContextOverflow with the usual wording
        return ids

    def count_prompt(self, text: str) -> int:
        """Tokens in text; beyond 4x the window an early count (the prompt cannot fit anyway)."""
        return encode_bounded(self.tokenizer, text, 4 * self.max_model_len)[1]

    def grammar_tokenizer(self):
        """llguidance's view of the vocabulary, built once (about a second)."""
        with self._grammar_lock:
            if self._grammar_tokenizer is None:
                self._grammar_tokenizer = build_tokenizer(self.tokenizer)
            return self._grammar_tokenizer

    def submit(self, req: GenerationRequest) -> Generation:
        return Generation(self, req)

    async def run(self, req: GenerationRequest) -> AsyncIterator[Event]:
        gen = self.submit(req)
        async for ev in gen.events():
            yield ev
