"""The single thread that owns the engine (LLMEngine is not thread-safe).

It hands every request to the engine as it arrives, steps the engine (continuous batching:
every running request advances together) and hands each StepOutput to the asyncio side.
Admission -- when a request starts running -- has one owner, the engine's scheduler
(`max_num_seqs`, and only when its prompt fits the KV cache); this loop only sheds load at
`submit` (more than `max_running + max_waiting` requests in flight: 429).
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from ..engine.llm_engine import StepOutput
from .errors import Overloaded
from .operations.metrics import Metrics

log = logging.getLogger("freetoken.server")


@dataclass
class Job:
    request_id: str
    prompt_ids: list[int]
    params: object
    loop: asyncio.AbstractEventLoop
    outputs: asyncio.Queue = field(default_factory=asyncio.Queue)
    submitted: float = field(default_factory=time.monotonic)
    last_read: float = field(default_factory=time.monotonic)   # the consumer's last take
    stalled: bool = False
    want_prompt_logits: bool = False      # echo with logprobs (engine add_request)

    def push(self, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.outputs.put_nowait, item)
        except RuntimeError:  # the event loop is gone (shutdown)
            pass


class EngineLoop:
    """The single thread that talks to the engine."""

    def __init__(self, engine, max_running: int, max_waiting: int, metrics: Metrics,
                 stall_timeout: float = 30.0):
        self.engine = engine
        self.stall_timeout = stall_timeout
        self._stall_check_at = 0.0
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.metrics = metrics
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.waiting: collections.deque[Job] = collections.deque()
        self.running: dict[str, Job] = {}
        self.lock = threading.Lock()
        self.n_waiting = 0
        self.n_running = 0
        self.stopping = threading.Event()
        self.draining = threading.Event()
        self.drain_deadline = float("inf")
        self.thread = threading.Thread(target=self._run, name="freetoken-engine", daemon=True)
        self.stats_every = 1.0
        self._stats_at = 0.0
        self.failures = 0            # engine steps failed in a row; any good step resets it
        self.last_error = ""
        self.watcher = None          # memory/watcher.py, set by `serve --memory-floor-gib`
        engine.on_preempt(lambda request_id: metrics.preemptions.inc())   # the scheduler logs each

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping.set()
        self.commands.put(("wake", None))
        if self.thread.is_alive():
            self.thread.join(timeout)

    def drain(self, timeout: float) -> None:
        """Take no new work; requests still running after `timeout` seconds end with a 503."""
        self.drain_deadline = time.monotonic() + timeout
        self.draining.set()
        self.commands.put(("wake", None))

    def submit(self, job: Job) -> None:
        with self.lock:
            if self.stopping.is_set() or self.draining.is_set():
                raise Overloaded("the server is shutting down", status=503, retry_after=5)
            if self.n_running + self.n_waiting >= self.max_running + self.max_waiting:
                raise Overloaded(f"server busy: {self.n_running} running and {self.n_waiting} "
                                 f"waiting requests; retry later", status=429, retry_after=1)
            self.n_waiting += 1
        self.metrics.waiting.inc()          # the engine thread sets the exact figure next
        self.commands.put(("add", job))

    def abort(self, request_id: str) -> None:
        self.commands.put(("abort", request_id))

    def memory(self, resize: dict | None = None) -> concurrent.futures.Future:
        """Resize (keyword arguments of LLMEngine.resize_memory) or, with None, read the sizes,
        on the engine thread between two steps. The future holds the result or the error."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if not self.thread.is_alive():
            fut.set_exception(Overloaded("the engine is not running", status=503))
            return fut
        self.commands.put(("memory", (resize, fut)))
        return fut

    def _gauges(self) -> None:
        """(engine thread only) requests running and waiting as the scheduler sees them."""
        running, waiting = self.engine.queue_lengths() if self.n_running else (0, 0)
        self.metrics.running.set(running)
        self.metrics.waiting.set(waiting + self.n_waiting)
        kv = self.engine.kv_usage()
        if kv is not None:
            self.metrics.kv_blocks_total.set(kv.usable)
            self.metrics.kv_blocks_in_use.set(kv.in_use)
            self.metrics.kv_evictions.set(kv.evicted)

    def _drain(self, block: bool) -> None:
        try:
            cmd = self.commands.get(timeout=0.05) if block else self.commands.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, arg = cmd
            if kind == "add":
                self.waiting.append(arg)
            elif kind == "abort":
                self._abort(arg)
            elif kind == "memory":
                self._memory(*arg)
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                return

    def _memory(self, resize: dict | None, fut: concurrent.futures.Future) -> None:
        try:
            result = self._resize(resize, "api") if resize is not None else {}
            result["sizes"] = self.engine.memory_sizes()
        except Exception as e:  # noqa: BLE001 - reported to the caller
            fut.set_exception(e)
            return
        fut.set_result(result)

    def _resize(self, kwargs: dict, trigger: str) -> dict:
        result = self.engine.resize_memory(**kwargs, trigger=trigger)
        self.metrics.record_resize(result, self.engine.memory_sizes())
        return result

    def _watch(self) -> None:
        if self.watcher is None:
            return
        try:
            want = self.watcher.poll(self.engine.memory_sizes)
            for dev, free in self.watcher.last_free.items():
                self.metrics.memory_free.labels(dev).set(free)
            if want is not None:
                self._resize(want, "watcher")
        except Exception:  # noqa: BLE001 - the watcher must never stop serving
            log.exception("memory watcher failed; it is switched off")
            self.watcher = None

    def _abort(self, request_id: str) -> None:
        for job in self.waiting:
            if job.request_id == request_id:
                self.waiting.remove(job)
                with self.lock:
                    self.n_waiting -= 1
                job.push(_aborted(job))
                return
        if request_id in self.running:
            try:
                self.engine.abort_request(request_id)
            except Exception:
                log.exception("abort_request(%s) failed", request_id)

    def _hand_over(self) -> None:
        """Every queued job to the engine (the scheduler decides when it runs); a request the
        engine refuses (InvalidRequestError, PromptTooLongError) fails alone."""
        while self.waiting:
            job = self.waiting.popleft()
            with self.lock:
                self.n_waiting -= 1
            try:
                extra = {"want_prompt_logits": True} if job.want_prompt_logits else {}
                self.engine.add_request(job.request_id, job.prompt_ids, job.params, **extra)
            except Exception as e:  # noqa: BLE001 - reported to that request only
                job.push(e)
                continue
            with self.lock:
                self.n_running += 1
            self.running[job.request_id] = job

    def _snapshot_stats(self) -> None:
        """Copy the engine's expert statistics for /metrics (only this thread calls it)."""
        now = time.monotonic()
        if now - self._stats_at < self.stats_every:
            return
        self._stats_at = now
        try:
            self.metrics.engine_stats = self.engine.expert_stats() or {}
        except Exception:  # noqa: BLE001 - statistics must never stop serving
            log.exception("expert_stats() failed")
            self.stats_every = float("inf")

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                self._iteration()
            except Exception as e:  # noqa: BLE001 - the engine thread must not die
                log.exception("engine step failed; failing %d running requests", len(self.running))
                self.failures += 1
                self.last_error = f"{type(e).__name__}: {e}"[:300]
                self.metrics.engine_failures.inc()
                self._fail_running(e)
        for job in list(self.running.values()) + list(self.waiting):
            job.push(Overloaded("the server is shutting down", status=503))

    def _iteration(self) -> None:
        self._drain(block=not self.running and not self.waiting)
        if self.draining.is_set() and time.monotonic() > self.drain_deadline:
            self._end_all(Overloaded("the server is shutting down and this request ran past its "
                                     "drain timeout", status=503, retry_after=5))
        self._watch()
        self._hand_over()
        self._gauges()
        self._snapshot_stats()
        if not self.running:
            return
        self._abort_stalled()
        outs = self.engine.step()
        self._count_failures(outs)
        for out in outs:
            job = self.running.get(out.request_id)
            if job is None:
                continue
            job.push(RuntimeError(f"engine error: {out.error}") if out.error else out)
            if out.finished:
                del self.running[out.request_id]
                with self.lock:
                    self.n_running -= 1
        self._gauges()

    def _count_failures(self, outs) -> None:
        """A step that made no token and failed requests in the model (a forward that raised
        even alone, NaN logits) counts as a failed step for /health; any progress resets the
        count. A request failed by its own work (its grammar, its detokenization) does not."""
        errors = [o.error for o in outs if o.model_fault]
        if errors and not any(o.new_token_ids for o in outs):
            self.failures += 1
            self.last_error = errors[0][:300]
            self.metrics.engine_failures.inc()
        else:
            self.failures = 0

    def _abort_stalled(self) -> None:
        """A client that stops reading must not keep its slot generating to max_tokens:
        output waiting unread for stall_timeout seconds aborts its request."""
        now = time.monotonic()
        if now - self._stall_check_at < min(1.0, self.stall_timeout / 4):
            return
        self._stall_check_at = now
        for rid, job in self.running.items():
            if not job.stalled and job.outputs.qsize() and now - job.last_read > self.stall_timeout:
                job.stalled = True
                log.warning("req=%s: the client has read nothing for %.0fs; aborting it",
                            rid, now - job.last_read)
                self.metrics.stalled.inc()
                try:
                    self.engine.abort_request(rid)
                except Exception:  # noqa: BLE001
                    log.exception("abort_request(%s) failed", rid)

    def _end_all(self, err: Exception) -> None:
        for job in self.waiting:
            job.push(err)
        self.waiting.clear()
        with self.lock:
            self.n_waiting = 0
        if self.running:
            log.warning("drain timeout: ending %d running requests", len(self.running))
        self._fail_running(err, wrap=False)

    def _fail_running(self, e: Exception, wrap: bool = True) -> None:
        for rid, job in list(self.running.items()):
            try:
                self.engine.abort_request(rid)
            except Exception:  # noqa: BLE001
                pass
            job.push(RuntimeError(f"engine error: {e}") if wrap else e)
        self.running.clear()
        with self.lock:
            self.n_running = 0


def _aborted(job: Job) -> StepOutput:
    return StepOutput(job.request_id, [], "", True, "abort", len(job.prompt_ids), 0)
