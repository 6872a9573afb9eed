"""The engine: requests in, one scheduler iteration per `step()`, incremental outputs out.
Not thread-safe: one thread owns it (the server runs it in its own loop thread)."""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from ..config import EngineConfig, check_cuda_graphs
from ..errors import InvalidRequestError, NumericalError, PromptTooLongError
from ..layers.attention.paged import kv_values_per_token
from ..loading.loader import load_model
from ..sampling_params import SamplingParams
from ..tokenizer import Tokenizer
from .prefix.anchors import AnchorFinder
from .block_manager import BlockManager
from .prefix.checkpoint_policy import CheckpointPolicy
from .model_runner import ModelRunner
from .prefix.cache import PrefixCache
from . import sampler
from .logprobs import token_logprobs
from .scheduler import Scheduler
from .spec import verify as verify_rule
from .spec.draft_model import DraftModelDrafter
from .spec.speculator import Speculator
from .verify_probe import verify_curve
from .sequence import Sequence, Status
from ..memory.plan import kv_block_count, kv_tokens_asked
from ..memory.resolve import resolve
from .resize import memory_sizes, resize_memory

log = logging.getLogger("freetoken.engine")


@dataclass
class StepOutput:
    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    stop_reason: str | int | None = None   # the stop string or stop/EOS token id that ended it
    num_cached_tokens: int = 0             # prompt tokens served from the prefix cache, not computed
    error: str | None = None               # set (finish_reason "error") when this request's work raised
    model_fault: bool = False              # ...in the model's forward or as NaN logits, not its own settings
    prompt_logits: torch.Tensor | None = None   # want_prompt_logits: [prompt, vocab] float32, when it ends
    logprobs: list | None = None           # params.logprobs set: a TokenLogprob per new token (engine/logprobs.py)


@dataclass(frozen=True)
class KVUsage:
    """The paged KV pool now, in blocks as /metrics counts them."""
    usable: int              # blocks requests may hold (the null block left out)
    in_use: int              # held by requests (blocks only the prefix cache holds are available)
    evicted: int             # prefix-cache blocks evicted so far
    num_blocks: int          # allocated, the null block included
    block_size: int          # tokens a block


class LLMEngine:
    def __init__(self, cfg: EngineConfig):
        t0 = time.perf_counter()
        # seconds per start-up phase (plan, open, build, tokenizer, kv), logged and read by bench/startup.py
        self.startup_timings: dict[str, float] = {}
        settings = resolve(cfg)              # every size decided here, once (sizes that cannot fit reduced)
        self.memory_plan = settings.plan         # None only for settings made without resolve()
        self.startup_timings["plan"] = time.perf_counter() - t0
        self.cfg = cfg
        if settings.num_threads:
            torch.set_num_threads(settings.num_threads)
        # the tokenizer (and its chat template) is built while the weights are read
        with ThreadPoolExecutor(1, thread_name_prefix="tokenizer") as ex:
            tokenizer = ex.submit(Tokenizer, cfg.model)
            self.model, self.settings = load_model(cfg, settings, self.startup_timings)
            t1 = time.perf_counter()
            self.tokenizer = tokenizer.result()
        t2 = time.perf_counter()
        self.startup_timings["tokenizer_wait"] = t2 - t1
        self.max_model_len = self.settings.max_model_len
        self.vocab_size = self.model.vocab_size             # token ids a prompt may hold: [0, vocab_size)
        bs = self.settings.kv_block_size
        num_blocks = max(2, self.settings.kv_blocks or self._unplanned_kv_blocks())   # the null block + one
        self.blocks = BlockManager(num_blocks, bs)
        make_state = self._state_factory()
        graphs = None
        if cfg.cuda_graphs:
            check_cuda_graphs(self.settings.device, self.settings.moe_backend, self.settings.expert_tier,
                              self.model.make_state() is not None, bool(cfg.record_routing))
            graphs = {"max_batch": self.settings.max_num_seqs, "max_model_len": self.max_model_len}
        self.runner = ModelRunner(self.model, num_blocks, bs, graphs)
        self.graphs_on = graphs is not None
        self._has_state = make_state is not None   # a recurrent state: no per-sequence rerun
        self.num_request_failures = 0                          # requests failed alone by their own fault
        anchors = AnchorFinder.from_tokenizer(self.tokenizer) if make_state is not None and self.settings.prefix_cache else None
        self.prefix = PrefixCache(self.blocks, enabled=self.settings.prefix_cache, make_state=make_state,
                                  policy=CheckpointPolicy(anchors=anchors, per_session=cfg.state_checkpoints),
                                  state_budget_bytes=self.settings.state_cache_bytes)
        self._preempt_listeners: list = []
        self.scheduler = Scheduler(self.blocks, self.settings.max_num_seqs, self.settings.max_num_batched_tokens, self.prefix,
                                   on_preempt=self._preempted)
        self.device = self.runner.device
        self.capacity_tokens = (num_blocks - 1) * bs
        self.seqs: dict[str, Sequence] = {}
        self._aborted: list[Sequence] = []
        self._seed = torch.Generator().manual_seed(cfg.seed)
        self.spec = self._speculator()
        self.startup_timings["kv"] = time.perf_counter() - t2
        if self.spec is not None and cfg.spec_probe:
            t3 = time.perf_counter()
            steps, source = verify_curve(self)
            self.startup_timings["spec_probe"] = time.perf_counter() - t3
            self.spec.price.set_probe(steps, f"{source} ({self.startup_timings['spec_probe']:.2f} s at start)")
            log.info("verify cost curve: %s", self.spec.price.probe_note)
        self.startup_timings["total"] = time.perf_counter() - t0
        log.info("started in %.2f s (%s)", self.startup_timings["total"],
                 ", ".join(f"{k} {v:.2f} s" for k, v in self.startup_timings.items() if k != "total"))
        log.info("model %s (%d layers), resolved settings:\n%s", cfg.model, self.model.num_layers, self.settings.table(
            kv_blocks=f"{num_blocks} x {bs} tokens ({self.runner.kv_nbytes / 2**20:.1f} MiB)"))

    def _speculator(self) -> Speculator | None:
        """Speculative decoding. Models with a recurrent or window state snapshot it before a
        verify and restore it when a draft is rejected (`_verify`)."""
        if self.cfg.speculative == "off":
            return None
        if self.graphs_on:
            log.info("speculative decoding off: decode runs as CUDA graph replays of one position each")
            return None
        return Speculator(self.cfg.speculative, self.cfg.spec_max_draft, self.model, self.max_model_len,
                          self._draft_model(), self.cfg.spec_lookahead)

    def _draft_model(self) -> DraftModelDrafter | None:
        """`--draft-model`: an engine of its own for the draft checkpoint (its model, runner and KV
        blocks; no prefix cache, no speculation), on the same device, dtype and threads."""
        path = self.cfg.draft_model
        if not path:
            return None
        c = self.cfg
        cfg = EngineConfig(model=path, dtype=c.dtype, device=c.device, compute_dtype=c.compute_dtype,
                           kernel_isa=c.kernel_isa, prefill_gemm=c.prefill_gemm, bf16_dot=c.bf16_dot, decode_gemv=c.decode_gemv,
                           decode_attention=c.decode_attention,
                           prefill_attention=c.prefill_attention, int8_tiles=c.int8_tiles, max_num_seqs=c.max_num_seqs, kv_block_size=c.kv_block_size,
                           num_threads=c.num_threads, prefix_cache=False, speculative="off", seed=c.seed,
                           max_num_batched_tokens=c.max_num_batched_tokens)
        return DraftModelDrafter(LLMEngine(cfg), self.tokenizer, self.vocab_size, path)

    def _unplanned_kv_blocks(self) -> int:
        """KV blocks when no memory plan could be made (a config the plan does not understand):
        the options' ask, with the bytes per token of the layers the model built."""
        per_token = kv_values_per_token(self.model.kv_layers()) * torch.finfo(self.model.kv_dtype).bits // 8
        return kv_block_count(kv_tokens_asked(self.cfg, self.max_model_len, per_token), self.settings.kv_block_size)

    def _state_factory(self):
        """How to make a fresh per-sequence state, for models that carry one (hybrid models)."""
        probe = self.model.make_state()
        return self.model.make_state if probe is not None and probe.parts else None

    # --- requests ------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    want_prompt_logits: bool = False) -> None:
        if request_id in self.seqs:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        if not prompt_token_ids:
            raise InvalidRequestError("prompt: expected at least one token")
        vocab = self.vocab_size
        bad = next((t for t in prompt_token_ids if not (isinstance(t, int) and 0 <= t < vocab)), None)
        if bad is not None:
            raise InvalidRequestError(f"prompt: token id {bad!r} is outside the vocabulary [0, {vocab})")
        limit = min(self.max_model_len, self.capacity_tokens)
        if len(prompt_token_ids) + 1 > limit:
            raise PromptTooLongError(f"prompt: {len(prompt_token_ids)} tokens, but the context holds {limit} "
                                     "(prompt + at least one generated token)")
        seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, (1,), generator=self._seed))
        seq = Sequence(request_id, prompt_token_ids, params, self.tokenizer, seed, want_prompt_logits)
        self.seqs[request_id] = seq
        self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> None:
        seq = self.seqs.get(request_id)
        if seq is not None and seq.status is not Status.FINISHED:
            self.scheduler.finish(seq, "abort")
            self._aborted.append(seq)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._aborted)

    def queue_lengths(self) -> tuple[int, int]:
        return len(self.scheduler.running), len(self.scheduler.waiting)

    def kv_usage(self) -> KVUsage:
        b = self.blocks
        return KVUsage(b.num_usable, b.num_held_by_requests, self.prefix.stats.evicted_blocks,
                       b.num_blocks, b.block_size)

    def on_preempt(self, listener) -> None:
        """Call listener(request_id) whenever a running request is preempted (KV blocks ran
        out, or a KV shrink): it resumes later from its cached prefix."""
        self._preempt_listeners.append(listener)

    def _preempted(self, seq: Sequence) -> None:
        for listener in self._preempt_listeners:
            listener(seq.request_id)

    # --- one iteration -------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        """One scheduler iteration (drafting, the forward, sampling) with the model's own kernel
        switches in place, the caller's back after (kernels/switch_set.py)."""
        with self.model.kernel_switches.installed():
            outputs = self._step()
        if not self.scheduler.has_unfinished():
            self.runner.idle()
        return outputs

    def _step(self) -> list[StepOutput]:
        outputs = [self._output(s, [], "") for s in self._aborted]
        for s in self._aborted:
            self.seqs.pop(s.request_id, None)
        self._aborted = []
        if self.spec is not None:
            self.spec.propose(self.scheduler.running, self.scheduler.budget)
        batch = self.scheduler.schedule()
        if not batch:
            if self.scheduler.waiting and not self.scheduler.running:   # cannot fit even alone
                seq = self.scheduler.waiting[0]
                log.warning("request %s does not fit the KV cache; finishing it", seq.request_id)
                self.scheduler.finish(seq, "length")
                outputs.append(self._output(seq, [], seq.detok.take(True) if seq.detok else ""))
                self.seqs.pop(seq.request_id, None)
            return outputs
        batch = [(seq, n) for seq, n in batch if self._guard(seq, outputs, self._copy_rows, seq)]
        if not batch:
            return outputs
        for seq, _ in batch:
            if seq.draft and seq.state is not None:
                seq.draft_snapshot = seq.state.snapshot()
        logits, full, verify, batch = self._forward(batch, outputs)
        to_sample = []
        for i, (seq, n) in enumerate(batch):
            if verify[i] is not None:          # a draft: the pending token and k drafted ones
                out = self._guard(seq, outputs, self._verify, seq, verify[i])
                if out:
                    outputs.append(out)
            elif self._guard(seq, outputs, self._advance, seq, n, full[i]) and seq.num_pending == 0:
                to_sample.append(i)
        if not to_sample:
            return outputs
        for i, tok in self._sample(logits, [batch[i][0] for i in to_sample], to_sample, outputs):
            seq = batch[i][0]
            out = self._guard(seq, outputs, self._emit, seq, tok)
            if out:
                if seq.params.logprobs is not None:     # the raw row: sampling worked on copies
                    out.logprobs = [token_logprobs(logits[i], tok, seq.params.logprobs)]
                outputs.append(out)
        return outputs

    # --- per-request work, each failing its own request alone ----------------------------
    def _guard(self, seq: Sequence, outputs: list, fn, *args):
        """fn(*args), or None after failing `seq` alone when it raises (the step goes on)."""
        try:
            return fn(*args) or True
        except Exception as e:  # noqa: BLE001 - one request's fault must not end the others
            self._fail(seq, e, outputs)
            return None

    def _fail(self, seq: Sequence, err: Exception, outputs: list, model_fault: bool = False) -> None:
        """End one request with finish_reason "error": its blocks go back to the pool and its
        half-made KV rows or state are not published to the prefix cache."""
        log.error("request %s failed in the engine (%s: %s); the other requests go on",
                  seq.request_id, type(err).__name__, err, exc_info=err)
        seq.state = None                        # a forward that raised may have half-advanced it
        self.scheduler.finish(seq, "error")
        self.seqs.pop(seq.request_id, None)
        self.num_request_failures += 1
        out = self._output(seq, [], "")
        out.error = f"{type(err).__name__}: {err}"[:500]
        out.model_fault = model_fault or isinstance(err, NumericalError)
        outputs.append(out)

    def _copy_rows(self, seq: Sequence) -> None:
        if seq.pending_copies:
            self.runner.copy_rows(seq.pending_copies)
            self.prefix.copies_done(seq)

    def _forward(self, batch, outputs):
        """The batch's forward. When it raises, the fault is not attributable: each sequence
        runs alone instead (a rerun writes the same KV slots, so this is safe) and only those
        that raise alone fail. Models with a recurrent state cannot rerun (the failed forward
        may have advanced some layers' state), so there the batch's requests fail."""
        try:
            if self.spec is not None:
                self.spec.begin_forward(batch)
            logits, full, verify = self.runner.run(batch)
            if self.spec is not None:
                self.spec.end_forward()
            return logits, full, verify, batch
        except Exception as e:  # noqa: BLE001
            if len(batch) == 1 or self._has_state:
                for seq, _ in batch:
                    self._fail(seq, e, outputs, model_fault=True)
                return None, [], [], []
            log.warning("a batched forward of %d requests raised (%s: %s); rerunning each alone",
                        len(batch), type(e).__name__, e)
        rows, fulls, verifies, kept = [], [], [], []
        for seq, n in batch:
            try:
                logits, full, verify = self.runner.run([(seq, n)])
            except Exception as e:  # noqa: BLE001
                self._fail(seq, e, outputs, model_fault=True)
                continue
            rows.append(logits)
            fulls.extend(full)
            verifies.extend(verify)
            kept.append((seq, n))
        return (torch.cat(rows) if rows else None), fulls, verifies, kept

    def _advance(self, seq: Sequence, n: int, full) -> None:
        prompt_len = len(seq.prompt_ids)
        seq.prompt_computed += max(0, min(seq.num_computed + n, prompt_len) - seq.num_computed)
        seq.num_computed += n
        self.prefix.after_step(seq)
        if full is not None:
            seq.prompt_logits.append(full)

    def _sample(self, logits, seqs: list[Sequence], rows: list[int], outputs: list):
        """[(batch row, token)] for the sequences that could be sampled; one whose sampling
        raises (its logits processor or grammar, NaN logits) fails alone. Each is sampled
        once: a seeded generator must not draw twice."""
        if sampler.plain_greedy(seqs):
            try:                            # one argmax for the batch; nothing to redo below
                every = len(rows) == logits.shape[0]       # (rows ascend: then they are all of them)
                return list(zip(rows, sampler.sample(logits if every else logits[rows], seqs)))
            except Exception:  # noqa: BLE001 - find whose row it was, one at a time
                pass
        got = []
        for row, seq in zip(rows, seqs):
            tok = self._guard(seq, outputs, lambda r=row, s=seq: [sampler.sample(logits[[r]], [s])[0]])
            if tok:                         # a one-element list: token 0 is a token too
                got.append((row, tok[0]))
        return got

    def _verify(self, seq: Sequence, rows: torch.Tensor) -> StepOutput:
        """A decoding sequence's pending token ran with k drafted tokens after it: keep the
        drafted tokens the acceptance rule takes (spec/verify.py), then the token of the first
        position that rejects its draft (or of the last); emitted one by one, with every stop
        rule applied as plain decoding would. The KV rows of rejected tokens are left behind
        (never read: attention stops at num_computed) and their whole blocks go back."""
        draft, source, snap = seq.draft, seq.draft_source, seq.draft_snapshot
        seq.draft, seq.draft_source, seq.draft_snapshot = [], None, None
        start = seq.num_computed                 # the pending token's position
        seq.num_computed = start + 1
        plain = sampler.plain_greedy([seq])
        greedy = verify_rule.greedy_run(rows, draft) if plain else None
        new, accepted, reason = [], 0, None
        for i in range(len(draft) + 1):
            d = draft[i] if i < len(draft) else None
            if plain:
                tok = greedy[i]
                ok = tok == d
            else:
                tok, ok = verify_rule.choose(rows[i], seq, d)
            seq.append(tok)
            if ok:
                accepted += 1
                seq.num_computed = start + 1 + accepted     # its KV row, written by this step, stands
            new.append(tok)
            reason = self._finish_reason(seq, tok)
            if reason or not ok:
                break
        self.spec.verified(source, len(draft), accepted)
        if snap is not None and accepted < len(draft):
            # the state absorbed every drafted token: back to before the step; the accepted
            # tokens and the new one run again next step (their KV rows are rewritten alike)
            seq.state.restore(snap)
            seq.num_computed = start
        text = seq.detok.take(reason is not None) if seq.detok else ""
        if reason:
            self.scheduler.finish(seq, reason)
            self.seqs.pop(seq.request_id, None)
        else:
            self.prefix.after_step(seq)
            self.blocks.trim(seq, seq.num_computed)
        out = self._output(seq, new, text)
        if seq.params.logprobs is not None:      # row i is the target model's raw row for token i
            out.logprobs = [token_logprobs(rows[i], tok, seq.params.logprobs) for i, tok in enumerate(new)]
        return out

    def _emit(self, seq: Sequence, tok: int) -> StepOutput:
        seq.append(tok)
        reason = self._finish_reason(seq, tok)
        text = seq.detok.take(reason is not None) if seq.detok else ""
        if reason:
            self.scheduler.finish(seq, reason)
            self.seqs.pop(seq.request_id, None)
        return self._output(seq, [tok], text)

    def _finish_reason(self, seq: Sequence, tok: int) -> str | None:
        p = seq.params
        if tok in p.stop_token_ids or (not p.ignore_eos and tok in self.tokenizer.eos_token_ids):
            return "stop"                        # the stop token itself is not part of the text
        if seq.detok is not None and seq.detok.add(tok):
            return "stop"
        if len(seq.output_ids) >= p.max_tokens or len(seq) >= self.max_model_len:
            return "length"
        return None

    @staticmethod
    def _output(seq: Sequence, new_ids: list[int], text: str) -> StepOutput:
        stop = None
        if seq.finish_reason == "stop":
            stop = seq.detok.matched_stop if seq.detok and seq.detok.matched_stop else seq.output_ids[-1]
        done = seq.want_prompt_logits and seq.finish_reason in ("stop", "length") and seq.prompt_logits
        return StepOutput(seq.request_id, new_ids, text, seq.status is Status.FINISHED, seq.finish_reason,
                          len(seq.prompt_ids), len(seq.output_ids), stop, seq.num_cached_tokens,
                          prompt_logits=torch.cat(seq.prompt_logits) if done else None)

    # --- elastic memory ----------------------------------------------------------------
    def resize_memory(self, *, expert_cache_gib: float | None = None, kv_cache_gib: float | None = None,
                      state_cache_gib: float | None = None, host_cache_gib: float | None = None,
                      allow_preempt: bool = True, trigger: str = "api") -> dict:
        """Grow or shrink the expert cache, the KV pool, the checkpoint budget and the disk
        tier's host cache now, between steps (engine/resize.py); outputs do not change.
        Returns what was done."""
        return resize_memory(self, expert_cache_gib=expert_cache_gib, kv_cache_gib=kv_cache_gib,
                             state_cache_gib=state_cache_gib, host_cache_gib=host_cache_gib,
                             allow_preempt=allow_preempt, trigger=trigger)

    def memory_sizes(self) -> dict:
        return memory_sizes(self)

    def pinned_bytes(self) -> int:
        """Host bytes of the expert pool page-locked in place now (0 without CUDA or pinning)."""
        return self.model.experts.pinned_bytes() if self.model.experts is not None else 0

    def expert_stats(self) -> dict:
        """Engine statistics for /metrics: the expert memory's and the prefix cache's."""
        # a dense model (or one whose layers are all dense) has no expert memory: say so
        stats = self.model.experts.stats() if self.model.experts is not None else {"dense": True}
        stats["prefix"] = self.prefix.stats_dict()
        if self.spec is not None:       # per drafter: drafts, proposed/accepted tokens, mean accepted length
            stats["speculative"] = self.spec.summary()
        return stats

    def close(self) -> None:
        self.runner.idle()              # closed mid-decode: torch gets the caller's threads back
        if self.model.experts is not None:
            self.model.experts.close()
        if self.spec is not None:
            self.spec.close()
