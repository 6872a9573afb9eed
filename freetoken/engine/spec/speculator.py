"""The engine's speculation: before each step, a draft for each decoding sequence, its length
k chosen to maximise the run's expected tokens per second; after the step, the statistics and
the price learn from what happened.

k for a sequence: each drafter's proposal gives up to K tokens and a confidence bucket (refined
by whether the drafters agree); the acceptance statistics give E[accepted | k] for that drafter
and bucket; the price gives the step's extra seconds with those k more positions (their share of
the union of experts included). Sequences are taken one by one, each adding its k to the step's
positions; the proposal and k with the most E[accepted] - R x extra seconds win, R the run's
recent speed times MARGIN (decide.py), and k = 0 unless a draft scores above 0."""
from __future__ import annotations

import time

from ...layers.attention import paged
from ...layers.kernel_rows import GEMV_TOKENS
from .acceptance import AcceptanceStats, Speedup
from .decide import MARGIN, best_length, choose, likeliest
from .drafters import Draft, with_agreement
from .mtp import MTPDrafter
from .lookahead import ExpertLookahead
from .ngram import NgramDrafter
from .price import VerifyPrice
from .routing import RoutingObserver
from .shadow import ShadowScores
from .suffix import SuffixDrafter


class Speculator:
    def __init__(self, mode: str, max_draft: int, model, max_model_len: int, draft_model=None,
                 lookahead: bool = True):
        """draft_model: a DraftModelDrafter (draft_model.py) for modes draft and auto, or None;
        lookahead: hand the experts backend the experts each verify is expected to route."""
        self.mode, self.K, self.max_model_len = mode, max_draft, max_model_len
        self.drafters = {}
        if mode in ("auto", "suffix"):
            self.drafters["suffix"] = SuffixDrafter()
        if mode in ("auto", "ngram"):
            self.drafters["ngram"] = NgramDrafter()
        # the checkpoint's nextn layer (loaded for --speculative mtp): drafts cost seconds, priced
        self.mtp = MTPDrafter(model.mtp) if mode == "mtp" and getattr(model, "mtp", None) is not None else None
        if self.mtp is not None:
            self.drafters["mtp"] = self.mtp
        if draft_model is not None and mode in ("auto", "draft"):
            self.drafters["draft"] = draft_model
        self._model, self._batch = model, []
        # on the CPU a step of at most GEMV_TOKENS rows is batch invariant (layers/kernel_rows.py):
        # each verify row has the bits of the plain decode step, so greedy output is plain's
        cpu = str(getattr(model, "device", "cpu")).startswith("cpu")
        self.max_rows = GEMV_TOKENS if cpu else 1 << 30
        self.stats = AcceptanceStats(max_draft)
        self.speed = Speedup()                      # the run's speed over plain: a drafted second's price
        self.shadow = ShadowScores(self.stats)      # drafts the price turned down, scored as tokens come
        self.observer = RoutingObserver(model)
        la = ExpertLookahead(model) if lookahead else None
        self.lookahead = la if la is not None and la.active else None
        pool = getattr(model, "pool", None)
        experts = getattr(model, "experts", None)
        est = getattr(experts, "est", None)            # the tiered backend's live bandwidths
        rate = est.b_h if est is not None else None
        nbytes = int(getattr(pool, "expert_nbytes", 0) or 0)
        num_experts = int(getattr(pool, "num_experts", 0) or 0)
        # where a miss reads from the disk, a verify's extra experts are priced at the reads they wait on
        self._experts = experts if hasattr(experts, "blocked_seconds") else None
        miss = self._experts.miss_seconds() if self._experts is not None else None
        self.price = VerifyPrice(len(self.observer.layers), self.observer.top_k, num_experts, nbytes, rate, miss_s=miss)
        self._blocked0 = 0.0
        probe = model.make_state()
        # models with a state restore it after a rejection and rerun the accepted tokens next step
        self.replays = probe is not None and bool(probe.parts)
        self.priced = True          # tests turn pricing off to force every draft through
        self._live: set[str] = set()
        self._t0 = self._att0 = 0.0
        self._step_positions = 0
        self._step_plain = True

    def close(self) -> None:
        """A draft model's engine closes with the target's."""
        if "draft" in self.drafters:
            self.drafters["draft"].close()

    # --- before the step -----------------------------------------------------------------
    def propose(self, running: list, budget: int) -> None:
        """Set `seq.draft` (and what made it) for the decoding sequences worth drafting for."""
        for s in running:
            s.draft, s.draft_source, s.draft_snapshot = [], None, None
        live = {s.request_id for s in running}
        for key in self._live - live:
            for d in self.drafters.values():
                d.forget(key)
            self.shadow.forget(key)
        self._live = live
        decoding = [s for s in running if s.num_pending == 1 and not s.want_prompt_logits]
        positions = sum(min(s.num_pending, budget) for s in running)
        tokens = float(len(decoding))
        if self.priced and not self.price.ready:
            for s in decoding:
                self._observe_tokens(s)
            return
        # the step's price without drafts, read once a draft is to be priced (drafters that cost
        # time to run price before drafting): a step with no proposal does not pay for the fit
        costed = "mtp" in self.drafters or any(hasattr(d, "seconds") for d in self.drafters.values())
        base = base0 = lam = None
        for seq in decoding:
            ctx = self._observe_tokens(seq)
            room = min(self.K, self.max_model_len - len(seq) - 1,
                       seq.params.max_tokens - len(seq.output_ids) - 1, budget - positions, self.max_rows - positions)
            if room <= 0:
                continue
            if base is None and costed:
                base = base0 = self.price.seconds(positions)
                lam = MARGIN * self.speed.value * len(decoding) / base0
            if "mtp" in self.drafters:
                drafts = self._mtp_draft(seq, ctx, room, tokens, positions, base, lam)
            else:
                drafts = self._proposals(seq, ctx, room, tokens, positions, base, lam)
            if not drafts:
                continue
            if base is None and self.priced:   # no sequence before this one drafted: the step's own positions
                base = base0 = self.price.seconds(positions)
                lam = MARGIN * self.speed.value * len(decoding) / base0
            if self.priced:
                draft, k = choose(drafts, self.stats, lambda d, j: self._extra(d, j, positions), lam)
            else:
                draft = likeliest(drafts, self.stats)
                k = len(draft.tokens)
            if not k:     # learn what it would have given (scoring the losing drafters' too was found to mislead)
                self.shadow.keep(seq.request_id, likeliest(drafts, self.stats), len(ctx))
                continue
            if self.priced:
                tokens += self.stats.expected_accepted(draft.drafter, draft.bucket, k)[k]
                base += self._extra(draft, k, positions)
            positions += k            # the step's rows so far (the room and the price of those after)
            seq.draft = list(draft.tokens[:k])
            seq.draft_source = draft
        if self.priced and decoding:      # the run's speed: this step's plain tokens and predicted time
            self.speed.step(len(decoding), len(decoding) * (base / base0 if base0 else 1.0))

    def _observe_tokens(self, seq) -> list[int]:
        ctx = seq.all_ids
        for d in self.drafters.values():
            d.observe(seq.request_id, ctx, 0)
        self.shadow.settle(seq.request_id, ctx)
        return ctx

    def _proposals(self, seq, ctx, room, tokens, positions, base, lam) -> list[Draft]:
        """Every drafter's proposal, the lookups' buckets refined by their agreement. A drafter
        that costs time to run (`seconds(k)`: a draft model) is priced first and asked only for
        the k that pays, and only when it promises more than the lookups' proposals."""
        lookups, costly, best_e = [], [], -1.0
        for d in self.drafters.values():
            k = room
            if self.priced and hasattr(d, "seconds"):
                behind = d.behind(seq.request_id, len(ctx))
                k = self._price(Draft((0,) * room, d.name, 0), room, tokens, positions, base,
                                lambda k: d.seconds(k, behind), lam)[0]
                if not k or self.stats.expected_accepted(d.name, 0, k)[-1] <= best_e:
                    continue          # not worth its time, or a lookup's draft promises as much
            dr = d.propose(ctx, k, key=seq.request_id)
            if dr is None:
                continue
            (costly if hasattr(d, "seconds") else lookups).append(dr)
            best_e = max(best_e, self.stats.expected_accepted(dr.drafter, dr.bucket, len(dr.tokens))[-1])
        return with_agreement(lookups) + costly

    def _mtp_draft(self, seq, ctx, room, tokens, positions, base, lam) -> list[Draft]:
        """The MTP layer drafts as many tokens as the price (its own measured seconds included)
        says pay, so no draft is made to be thrown away."""
        if self.priced:
            room = self._price(Draft((), "mtp", 0), room, tokens, positions, base, self.mtp.cost, lam)[0]
        dr = self.mtp.propose(ctx, room, key=seq.request_id) if room else None
        return [dr] if dr is not None else []

    def _extra(self, draft: Draft, k: int, positions: int, cost=None) -> float:
        """Seconds the step takes more with k more positions for `draft`; `cost(k)`: seconds to
        draft k tokens, where drafting is still to be done (a draft model, the MTP layer)."""
        base = self.price.seconds(positions)
        t = self.price.seconds(positions + k) - base + (cost(k) if cost is not None else 0.0)
        if self.replays:      # the rerun of 1 + accepted positions, unless all were accepted
            exp = self.stats.expected_accepted(draft.drafter, draft.bucket, k)[k]
            rerun = self.price.seconds(positions + exp + 1) - base
            t += (1 - self.stats.all_accepted(draft.drafter, draft.bucket, k)) * rerun
        return t

    def _price(self, draft: Draft, k_max: int, tokens: float, positions: int, base: float, cost=None, lam=None):
        """(k, tokens, positions, seconds) of the step with the k in 0..k_max worth most for
        `draft` (decide.py); lam: what a second of the step is worth in tokens (default: the
        run's speed for a step of `tokens` plain tokens taking `base` seconds). A draft already
        made is priced without `cost` (its time is spent)."""
        lam = MARGIN * self.speed.value * tokens / base if lam is None else lam
        exp = self.stats.expected_accepted(draft.drafter, draft.bucket, k_max)
        extra = [0.0] + [self._extra(draft, k, positions, cost) for k in range(1, k_max + 1)]
        k = best_length(exp, extra, lam)[0]
        if k:
            return k, tokens + exp[k], positions + k, base + extra[k]
        return 0, tokens, positions, base

    # --- around the forward -----------------------------------------------------------------
    def begin_forward(self, batch) -> None:
        for s, _ in batch:
            # a prompt is indexed in its prompt's steps (the prefill, or its last token after a
            # prefix-cache hit), not in its first decode step: the dense replay's 768-token prompts
            # took 4-12 ms there at load 8 (the suffix index and prompt lookup; 10-45 ms at load 10)
            if not s.output_ids and not s.want_prompt_logits:
                self._observe_tokens(s)
                self._live.add(s.request_id)    # forgotten at the next propose if it ended here
        self.observer.start()
        self._batch = batch
        self._step_positions = sum(n for _, n in batch)
        # only decode and verify steps teach the price (a prefill chunk is another kind of step)
        self._step_plain = all(n == 1 + len(s.draft) and s.num_pending == 1 for s, n in batch)
        if self.lookahead is not None:
            self.lookahead.begin(batch)
        self._att0 = paged.KERNEL_SECONDS[0]
        self._blocked0 = self._experts.blocked_seconds() if self._experts is not None else 0.0
        self._t0 = time.perf_counter()

    def end_forward(self) -> None:
        dt = time.perf_counter() - self._t0
        if self.mtp is not None:        # the main model's hidden states before its final norm
            self.mtp.take_hidden(self._batch, self._model.prenorm)
        if self.lookahead is not None:
            self.lookahead.end()
        if self._step_plain and self._step_positions:
            blocked = self._experts.blocked_seconds() - self._blocked0 if self._experts is not None else 0.0
            self.price.observe(self._step_positions, self.observer.unique, dt, paged.KERNEL_SECONDS[0] - self._att0,
                               blocked)

    def verified(self, draft: Draft, drafted: int, accepted: int) -> None:
        self.stats.observe(draft.drafter, draft.bucket, drafted, accepted)
        self.speed.accepted(accepted)

    def summary(self) -> dict:
        out = {"mode": self.mode, "max_draft": self.K, "drafters": self.stats.summary()}
        if self.lookahead is not None:
            out["lookahead"] = self.lookahead.stats()
        if "draft" in self.drafters and hasattr(self.drafters["draft"], "summary"):
            out["draft_model"] = self.drafters["draft"].summary()
        if self.price.theta is not None:
            a, b, c = (float(x) for x in self.price.theta)
            out["price"] = {"step_s": a, "per_position_s": b, "per_expert_s": c}
            if self.price.miss_prior is not None:      # the reads a step waits on, priced apart
                out["price"].update(blocked_plain_s=self.price.blocked_plain, per_expert_beyond_one_s=self.price.miss_s)
        return out
