"""The disk tier's experts backend: disk -> host expert cache -> the CPU kernels.

The expert pool stays in the model file (loading/disk_layout.py says where each expert lies); a
`HostExpertCache` of whole experts holds the working set in RAM. One MoE layer call:
  1. the call's unique experts, in ascending flat id, are made resident in the host cache
     (hits locked; misses read from the file, several at once) -- as many as the free slots
     hold; the rest follow in further rounds;
  2. the CPU kernels run them from the cache's slot banks. The kernel adds each token's
     expert outputs in ascending order of a rank, here their flat ids (`ft_moe_run_ranked`;
     without one, ascending slot order, and a call covers a run of experts whose slots ascend
     with their ids): every token's outputs are then added in the same order as the fully
     resident pool adds them, and the result is bit for bit the resident one whatever the
     cache size (tested down to one slot per layer). The same holds while reads are in
     flight: every expert of the call whose bytes are in RAM runs at once, in whatever order
     the reads land, each routed pair's output in a row of its own (`ft_moe_run_pairs`), the
     rows added in flat-id order at the end (`ft_moe_combine`; `_run_as_landed`); with
     overlap off only the landed prefix in id order runs ahead (`_landed_runs`); both
     tested against random read delays;
  3. decode: layer l+1's likely experts are read in the background while attention runs,
     as guessed by layer l+1's router on layer l's input or by the history predictor
     (`next_layer.py`), whichever has guessed better (lookahead.py); the reads start once the
     call has released its slots (layer-aware eviction then gives up the layer just run; with
     `HANDOFF`, off by default, the victims run first and their slots take the reads mid-call,
     handoff.py), and stop after a whole pass without a miss;
     prefill with >= 2*E routed pairs: layer l+1's whole expert set is read meanwhile (the
     double buffer of `prefill.py`, when the cache holds two layers). With the disk
     bandwidth B_D known (`freetoken profile`), a decode prefetch is cut to the experts the
     disk can bring while layer l+1's attention runs (B_D x the measured time between two
     layer calls / expert bytes, diskbw.py), likeliest first: more would queue ahead of that
     layer's own misses. Experts expected for layer l+1 (speculative drafts: the verify's tokens'
     earlier routing, memory/expected.py) go first; layer 0's are read when the step begins.
Integrity (experts/disk/integrity.py): every expert read from the file is checked against its checksum
(taken once per file version), and between steps the file's identity is looked at; when it
changed, every cached expert is dropped, /health says degraded until a background pass finds
the file matching its checksums again, and only verified bytes are ever served.
"""
from __future__ import annotations

import logging
import time

import numpy as np
import torch

from ..base import Experts
from .handoff import Handoff
from .integrity import ExpertFileWatch
from .pieces import DiskLayout
from ..measure.diskbw import prefetch_budget
from .host_cache import HostExpertCache
from .lookahead import DEPTH, LOOKAHEAD_CHOICES, GuessScore, RouterLookahead, chain
from ..memory.expected import ExpectedExperts
from ..memory.next_layer import THRESHOLD, NextLayerPredictor
from ..measure.stats import ExpertStats
from ..execution.torch_exec import run_experts
from ...kernels.pool import SPIN_US, shared_pool
from ..execution.cpu import CpuExpertExecutor
from ..memory.slots import DEFAULT_POLICY, layer_aware, parse_policy_options

log = logging.getLogger("freetoken.experts")
_NONE = np.empty(0, np.int64)       # no experts (shared: never written to)
_APART_BYTES = 32 << 20             # the most a call's per-pair output rows take (`_apart`)
# "auto": the router, while it has guessed worse so far than the history, guesses one decode layer
# call in this many, enough to keep its score current (its GEMV is the guess that costs); the history
# guesses every call (~15 us): sampled too, it read 1.13x the bytes at a 5% host cache (stop 47)
GUESS_SAMPLE = 8
# a call hands its victims' slots to the next layer's reads mid-call (handoff.py): off, since on this
# 2-core box it waited ~5x less on reads at a 5% host cache but decoded slower in 9 of 10 loaded A/B
# pairs (median 0.90x; the reads' hashing then competes with the kernels): `bench/disk_tier.py
# --handoff on` for the quiet A/B (docs/benchmarks.md "Host tier at a 5% cache"); on a loaded 2-core
# Zen 1 it also cost CPU: 248 against 217 ms a step (medians of 6), 0.87x the steps/s (stop 48, "disk5b")
HANDOFF = False
# a ratio r: the decode read-ahead reads only while every read so far stays within r x the reads the
# host cache would have made without guessing (prefetch_budget.py, the device tier's '+budget'); None:
# unbounded. Off: under load (docs/benchmarks.md "Stop 46: the disk tier's reads in priority
# order") 1.1 read 0.77x / 0.94x the bytes a token on the spread 4-layer / 48-layer files but turned
# guesses into demand misses (48 layers: 704 against 377 in 31 tokens, 26 against 15-20 ms a token
# blocked on reads); demand-first reads and dropping unread wrong guesses stay on either way.
# `bench/disk_tier.py --read-budget 1.1` for the quiet A/B
READ_BUDGET: float | None = None
# what a prompt chunk reads of layer l+1 while layer l runs: "routed", the experts layer l+1's router
# picks for the chunk's tokens on layer l's input (the whole layer where there is no router to
# borrow); "layer", the whole layer l+1 (the second buffer, as before issue 39's stop 47).
# `bench/disk_tier.py --prefill-read layer` for the A/B
PREFILL_READ = "routed"
# when a layer call starts its read-ahead of the next layer(s): True, as soon as it holds all its own
# experts (its misses queued first: they still read first), so the reads overlap this call's
# compute too, not only the next layer's attention (the layer just run gives up its slots as
# before: this call's are locked); a call whose experts do not all fit at once (a small cache)
# still reads ahead after it has released them, as does False (before issue 39's stop 47), and so
# does every call while a decode pass routes more experts than the cache holds (`_early`).
# `bench/disk_tier.py --read-ahead-at end` for the A/B
READ_AHEAD_FIRST = True
# decode: the router guess reads this many of layer l+1's experts beyond its top-k, those its router
# ranks next (`RouterLookahead.runners_up`), after the top-k and within the B_D budget where one is
# known: they cover some of the misses the top-k does not guess, for more bytes read. Off: on the
# 48-layer target (2-core Zen 4, loaded) 2 cut the misses to 0.65x and the time blocked on reads to
# 0.80x for 1.17x the bytes, 1.11x the CPU a token and 0.95x the tok/s (medians of 5 pairs,
# docs/benchmarks.md `disk39`); `bench/disk_tier.py --extra-guesses N` for the A/B
EXTRA_GUESSES = 0
# the host cache gives up layer 0's experts last (`SlotTable.keep`), while it holds a step's working
# set and layer 0 whole: a decode step's first layer has only the history's wrap guess, so a quarter
# of the 48-layer target's decode misses were layer 0's (85-86 of 343-353 in 31 tokens). Kept: 0.88x
# the misses for ~the same bytes a token; with PARK off, 8 alternating pairs at load 1-8 blocked on
# reads 0.84x as long (7 lower, 1 equal), CPU a token 0.95x, tok/s 1.00x (medians; at load 7-12 and
# with PARK on the waits were longer: docs/benchmarks.md `tier39`). `bench/disk_tier.py --keep-first off`
KEEP_FIRST = True
# a layer call about to wait on a read parks the kernel pool's idle workers (kernels/pool.py `park`):
# they sleep at once instead of spinning out SPIN_US first (the reads take ~1-3 ms; the spin's CPU
# is the readers' on a 2-core box; the 48-layer profile: ~23 ms of the worker's CPU a token in
# `sched_yield`). Off: no CPU a token saved that loaded A/Bs could see (park on/off 294/322, 306/258,
# 286/273 ms, load 7-12), and every pair with it on blocked longer on reads (docs/benchmarks.md
# `tier39`). `bench/disk_tier.py --park on` for the quiet A/B
PARK = False

# bytes/s a demand read is priced at where no profile measured B_D (`miss_seconds`): the 48-layer
# file's verifies waited ~1.2-1.4 ms for each 3.06 MB expert beyond a plain step's here (~2.2 GB/s,
# docs/benchmarks.md spec34h); the speculative price moves to what its own verifies wait
# (engine/spec/price.py)
MISS_READ_RATE = 2e9


class _TorchSlots:
    """Fallback executor (formats without a C kernel): torch over the slot banks."""

    def __init__(self, banks, spec):
        self.banks, self.spec = banks, spec

    def run(self, x, ids, w, out=None):
        return run_experts(self.banks, self.spec, ids, x, w, out=out)


class DiskExperts(Experts):
    keeps_expert_cache = True

    def __init__(self, layout: DiskLayout, device, slots: int, policy: str | None = None,
                 num_threads: int | None = None, spin_us: int | None = None, io_threads: int = 4,
                 prefetch: bool = True, drop_cache: bool = True, b_d: float | None = None, verify: bool = True,
                 lookahead: str = "auto", direct_io: str = "auto", overlap: bool = True):
        if lookahead not in LOOKAHEAD_CHOICES:
            raise ValueError(f"expert lookahead must be one of {', '.join(LOOKAHEAD_CHOICES)}, got {lookahead!r}")
        base, admit, _ = parse_policy_options(policy or DEFAULT_POLICY)
        self.layout, self.E, self.device = layout, layout.num_experts, torch.device(device)
        # every read checked against the expert's checksum, the file's identity watched (experts/disk/integrity.py)
        self.watch = ExpertFileWatch.open(layout) if verify else None
        table_policy = base + ("+layer" if layer_aware(policy or DEFAULT_POLICY) else "")
        self.cache = HostExpertCache(layout, slots, table_policy, io_threads, drop_cache, self.watch, direct_io,
                                     READ_BUDGET)
        if KEEP_FIRST:
            self.cache.table.keep((0,))
        if PARK:
            self.cache.on_block = self._park
        prefetch = prefetch and lookahead != "off"
        self.lookahead = lookahead if prefetch else "off"
        self.router: RouterLookahead | None = None          # attach_routes: layer l+1's router on layer l's input
        self.score = GuessScore()                            # the guesses read ahead
        self.scores = {"router": GuessScore(), "history": GuessScore()}   # each guess, read or not
        self.prefill_score = GuessScore()                    # a prompt chunk's reads of the next layer
        self._skip = {"router": 0, "history": 0}     # "auto" calls since each last guessed (`_due`)
        self._all_scores = (self.score, *self.scores.values())
        self.predictor = NextLayerPredictor(layout.num_layers, self.E, THRESHOLD, wrap=True) if prefetch else None
        self.depth = DEPTH           # layers read ahead (lookahead.py)
        self.extra = EXTRA_GUESSES   # the router guess's runners-up read too
        self.source = "off" if self.predictor is None else "history"
        self._quiet = 0              # decode layer calls in a row without a miss or a used read-ahead
        #                              (the lookahead sleeps after a whole pass of them)
        self._threads = (num_threads, spin_us)
        self.host = self._executor(num_threads, spin_us)
        self.stats_ = ExpertStats(layout.num_layers, "disk")
        self.phase = "decode"
        self.kernel_calls = 0        # kernel calls (runs of ascending slots), for the stats
        self.pool = layout           # what the engine reads as `experts.pool` (shape, bytes)
        self._layer_nbytes = layout.layer_expert_nbytes     # an expert's real bytes per layer (stats)
        self._S = layout.expert_nbytes      # a slot's bytes (a property that sums the banks: once, not per call)
        self.b_d = b_d               # disk bytes/s (the profile's B_D), None: prefetch unbounded
        self.gap_s: float | None = None     # EWMA of the time from one decode layer call to the next
        self._last = (-2, 0.0)       # (layer, end time) of the previous call
        self.prefetch_cut = 0        # predicted experts not prefetched (over the B_D budget)
        self.overlapped = 0          # expert runs computed while later reads of the call were in flight
        self.apart = 0               # layer-call rounds run as their reads landed (`_run_as_landed`)
        self.handoffs = 0            # layer calls whose victims' slots took the next reads mid-call (handoff.py)
        self.overlap = overlap       # a call's experts in RAM run while its other reads are in flight, in any
        #                              order (`_run_as_landed`); off: only a landed prefix runs ahead
        self.expected = ExpectedExperts()    # experts told ahead (speculative drafts)

    def _executor(self, num_threads, spin_us):
        sp = self.layout.spec
        try:
            return CpuExpertExecutor(self.cache.banks, sp.fmt, sp.hidden, sp.intermediate, sp.activation,
                                     sp.alpha, sp.limit,
                                     pool=shared_pool(num_threads, spin_us=SPIN_US if spin_us is None else spin_us))
        except (ValueError, NotImplementedError) as e:
            log.warning("disk tier: no CPU kernel for these experts (%s); running them with torch", e)
            return _TorchSlots(self.cache.banks, sp)

    def _park(self) -> None:
        """The kernel pool's workers sleep while this call waits on a read (`PARK`)."""
        getattr(self.host, "park", lambda: None)()

    def begin_step(self, phase: str, tokens: int | None = None) -> None:
        self.phase = phase
        if self.watch is not None and self.watch.poll():      # the file changed: keep nothing read from it
            self.cache.drop_all()
        self.stats_.step(phase)
        if phase == "decode":
            ahead = self._expected_ahead(0)
            self.expected.started_for(0, ahead[:self.cache.prefetch(ahead)])

    def expect(self, per_layer: dict | None) -> None:
        self.expected.expect(per_layer)

    def blocked_seconds(self) -> float:
        return self.cache.read_s

    def miss_seconds(self) -> float | None:
        return self._S / (self.b_d or MISS_READ_RATE)

    def _expected_ahead(self, layer: int) -> np.ndarray:
        """Experts expected at `layer` (flat ids) that are not in the host cache."""
        ids = self.expected.take(layer)
        if not len(ids) or layer >= self.layout.num_layers:
            return np.empty(0, np.int64)
        flat = ids + layer * self.E
        return flat[self.cache.table.slot_of[flat] < 0]

    def _read_ahead(self, layer: int, uniq: np.ndarray, local: np.ndarray, hidden) -> tuple[np.ndarray, np.ndarray]:
        """(layer+1's experts to read after this call, likeliest first; the speculative ones among
        them). The guesses of the last call are scored against `uniq` first. Each part runs only
        when it has something to do (issue 39: an all-hits call pays for no lookahead it skips):
        no guess pending, no speculative hint, lookahead asleep -> nothing allocated."""
        decode = self.phase == "decode"
        if decode and self._idle():
            return _NONE, _NONE
        if decode:
            if self.expected.started:
                self.expected.settle(layer, uniq - layer * self.E)
            listed = uniq.tolist()          # (once for the four scores)
            for sc in self._all_scores:
                sc.routed(layer, uniq, listed)
        elif self.predictor is not None:
            self.predictor.observe_tokens(layer, local)
        nxt = self._predict(layer, uniq, hidden)
        ahead = _NONE
        if decode and self.expected.want:
            ahead = self._expected_ahead(layer + 1)        # the speculative lookahead's first
            if len(ahead):
                nxt = np.concatenate([ahead, nxt[~np.isin(nxt, ahead)]])
        if len(nxt):
            budget = prefetch_budget(self.b_d, self.gap_s, self._S)
            if budget is not None and len(nxt) > budget:
                self.prefetch_cut += len(nxt) - budget
                nxt = nxt[:budget]
        return nxt, ahead

    def _prefill_ahead(self, layer: int, x, pairs: int) -> np.ndarray | None:
        """A prompt chunk's read of layer+1 while layer runs (None: none, the call reads as decode
        does): with a router to borrow (`PREFILL_READ` "routed"), the experts layer+1's router
        picks for any of the chunk's tokens on this layer's input, the chunk's union of the
        router lookahead: a prompt on spread routing does not route a whole layer (stop 46: ~9.8 GB
        of a 48-layer run's 22.8 GB were whole-layer reads never used); where the cache holds
        this layer's and the guess's experts. Otherwise the whole of layer+1 (the second buffer)
        where the chunk routes >= 2*E pairs and the cache holds two layers."""
        E, L = self.E, self.layout.num_layers
        if layer + 1 >= L:
            return None
        if PREFILL_READ == "routed" and self.router is not None:
            guess = self.router.chunk(layer, x)
            if guess is not None:
                if len(guess) and self.cache.capacity >= min(pairs, E) + len(guess):
                    flats = guess + (layer + 1) * E
                    self.prefill_score.guessed_for(layer + 1, flats)
                    return flats
                return None
        if pairs >= 2 * E and self.cache.capacity >= 2 * E:
            return np.arange((layer + 1) * E, (layer + 2) * E)      # the second buffer
        return None

    def _idle(self) -> bool:
        """A decode call has nothing to guess, score or read ahead: the lookahead asleep (or
        off), no guess waiting for this layer, no speculative hint (the common call at hits)."""
        return (self.predictor is None or self._quiet >= self.layout.num_layers) and not self.expected.started \
            and not self.expected.want and not any(sc.waiting for sc in self._all_scores)

    def forward(self, layer, hidden, topk_ids, topk_weights):
        t0 = time.perf_counter()
        if self.phase == "decode" and layer == self._last[0] + 1:
            gap = t0 - self._last[1]
            self.gap_s = gap if self.gap_s is None else 0.8 * self.gap_s + 0.2 * gap
        on_host = self.device.type == "cpu"
        x = hidden if on_host else hidden.to("cpu")
        w = topk_weights if on_host else topk_weights.to("cpu")
        flat, uniq = self._routed(layer, topk_ids, on_host)
        T, K = flat.shape
        local = flat - layer * self.E if self.phase != "decode" else None     # (a prompt's predictor counts)
        self.cache.cancel_guesses(layer, uniq)         # wrong guesses for this layer not read yet: dropped
        if self.phase == "prefill":
            self.prefill_score.routed(layer, uniq)
        nxt = self._prefill_ahead(layer, hidden, T * K) if self.phase == "prefill" else None
        if nxt is not None:
            if self.predictor is not None:
                self.predictor.observe_tokens(layer, local)
            ahead, streamed = _NONE, True
        else:
            streamed = False
            nxt, ahead = self._read_ahead(layer, uniq, local, hidden)
        out = torch.zeros(T, self.layout.spec.hidden, dtype=torch.float32)
        handing = self._handing(nxt)
        if not streamed and not handing and self._all_hits(layer, uniq, flat, x, w, out, T * K, nxt, t0):
            return out if on_host and out.dtype == hidden.dtype else out.to(hidden.device, hidden.dtype)
        c0 = dict(self.cache.c)
        read0 = self.cache.read_s
        calls = 0
        rest, started, early = uniq, 0, False
        stream = self._streams(T)
        while len(rest):
            n, slots, pending = self.cache.acquire_nowait(rest)
            hand = None
            try:
                if len(nxt) and n == len(uniq) and not handing and self._early():
                    started += self.cache.prefetch(nxt, budgeted=not streamed)     # (see READ_AHEAD_FIRST)
                    early = not self.cache.unplaced
                if not stream:
                    self.cache.landed(rest[:n], pending)
                    pending = [None] * n
                hand = Handoff.plan(self.cache, rest, slots, nxt) if handing and n == len(uniq) and stream \
                    and self._pairs(flat.size) else None
                if hand is not None or self._apart(pending, flat.size):
                    calls += self._run_as_landed(rest[:n], slots, pending, flat, x, w, out, hand)
                    self.apart += 1
                else:
                    for a, b in self._landed_runs(rest[:n], pending):
                        calls += self._run(rest[a:b], slots[a:b], flat, x, w, out)
            finally:
                self.cache.release(slots if hand is None else hand.rest())
            if hand is not None:
                started += hand.started
                self.handoffs += hand.started > 0
            rest = rest[n:]
        if len(nxt) > started and not early:    # after the release: this layer's experts, used furthest
            #                         ahead, are victims too (what found no victim while they were locked;
            #                         `early`: the read-ahead before the kernels left none unplaced)
            started += self.cache.prefetch(nxt, budgeted=not streamed)    # (a prefill's second buffer: no guess)
        if len(ahead):
            self.expected.started_for(layer + 1, ahead[:min(started, len(ahead))] - (layer + 1) * self.E)
        self.kernel_calls += calls
        c = self.cache.c
        if self.phase == "decode":      # guessing costs a router GEMV per layer: only while it has work
            self._quiet = 0 if c["misses"] != c0["misses"] or c["prefetch_used"] != c0["prefetch_used"] \
                else self._quiet + 1
        dt = time.perf_counter() - t0
        self.stats_.add(layer, calls=1, routed=T * K, hits=c["hits"] - c0["hits"] + c["waited"] - c0["waited"],
                        misses=c["misses"] - c0["misses"], fills=c["misses"] - c0["misses"],
                        prefetches=started, cpu_experts=len(uniq),
                        cpu_bytes=len(uniq) * int(self._layer_nbytes[layer]),
                        fill_s=self.cache.read_s - read0, cpu_s=dt - (self.cache.read_s - read0), wall_s=dt)
        if streamed:
            self.stats_.add(layer + 1, streamed_layers=1)
        self._last = (layer, time.perf_counter())
        return out if on_host and out.dtype == hidden.dtype else out.to(hidden.device, hidden.dtype)

    def _routed(self, layer: int, topk_ids, on_host: bool) -> tuple[np.ndarray, np.ndarray]:
        """(the call's flat ids [T, K], their distinct values ascending): one C call on the top-k
        tensor where the cache has the hit path's C calls (c_hits.py; in situ numpy's add, sort
        and dedup cost ~45 us a decode call), numpy otherwise."""
        hc = self.cache.hits_c
        if hc is not None and on_host and topk_ids.dtype == torch.int64 and topk_ids.is_contiguous() \
                and topk_ids.dim() == 2:
            return hc.route(topk_ids.data_ptr(), *topk_ids.shape, layer * self.E)
        flat = (topk_ids if on_host and topk_ids.dtype == torch.int64 else topk_ids.to("cpu", torch.int64)).numpy() \
            + layer * self.E
        T, K = flat.shape
        uniq = np.sort(flat[0]) if T == 1 else np.unique(flat)    # one token: a sort is cheaper
        if T == 1 and len(set(uniq.tolist())) < K:              # (a set: ~3x cheaper than comparing)
            uniq = np.unique(uniq)
        return flat, uniq

    def _early(self) -> bool:
        """Whether this call reads ahead before it computes (READ_AHEAD_FIRST): not while a decode
        pass routes more experts than the cache holds, where an early guess takes the slot of an
        expert this pass still needs (at a 5% cache: 1.5x the bytes, docs/benchmarks.md stop 47)."""
        return READ_AHEAD_FIRST and not self.cache.over_capacity()

    def _all_hits(self, layer: int, uniq: np.ndarray, flat: np.ndarray, x, w, out, routed: int, nxt: np.ndarray,
                  t0: float) -> bool:
        """The call at full hits, with as little bookkeeping as a resident call has (issue 39
        item 4: the tier's overhead at hits): one locked gather of the slots (the cache's
        `ready_of`), one kernel call (ranked by flat id where the slots do not ascend with
        the ids: `_run`), the counters. False (nothing done) when one of `uniq` is not
        resident and landed: the general path then reads it."""
        used = self.cache.c["prefetch_used"]
        got = self.cache.acquire_hits(layer, uniq, flat)
        if got is None:
            return False
        slots, ordered, held = got
        early = len(nxt) and self._early()
        started = self.cache.prefetch(nxt) if early else 0   # read ahead as the general path
        try:
            if ordered:         # the one kernel call of the resident pool, on the slots
                self.host.run(x, torch.from_numpy(slots), w, out=out)
                calls = 1
            elif self._ranked(flat.size):    # the slots gathered above ranked by flat id (`_run`'s call)
                self.host.run(x, torch.from_numpy(slots), w, out=out, rank=torch.from_numpy(flat))
                calls = 1
            else:
                calls = self._run(uniq, self.cache.ready_of[uniq], flat, x, w, out)
        finally:
            self.cache.release_hits(held)
        if len(nxt) > started and (not early or self.cache.unplaced):   # (what found no victim while this
            started += self.cache.prefetch(nxt)                            # call's slots were locked)
        self.kernel_calls += calls
        if self.phase == "decode":      # a hit that a read-ahead brought keeps the lookahead awake
            self._quiet = 0 if self.cache.c["prefetch_used"] != used else self._quiet + 1
        self.stats_.add_hit_call(layer, routed, len(uniq), int(self._layer_nbytes[layer]), started,
                                 time.perf_counter() - t0)
        self._last = (layer, time.perf_counter())
        return True

    def _handing(self, nxt: np.ndarray) -> bool:
        """Whether this call may hand its slots to the next layer's reads as its experts run
        (handoff.py): overlap on, reads ahead wanted that are not resident yet, and the step's
        experts over the cache's capacity (then those reads take this layer's slots)."""
        return HANDOFF and self.overlap and len(nxt) > 0 and self.cache.over_capacity() \
            and bool((self.cache.table.slot_of[nxt] < 0).any())

    def _streams(self, T: int) -> bool:
        """Whether a call may run its experts in pieces as their reads land: only where the C
        kernel runs every expert (no torch GEMM for experts with >= gemm_tokens tokens, which
        a call runs ahead of the others: a piece boundary would move them in the sum)."""
        gemm = getattr(self.host, "gemm_tokens", None)
        return getattr(self.host, "lib", None) is not None and (not gemm or T < gemm)

    def _apart(self, pending: list, pairs: int) -> bool:
        """Whether a call's experts run as their reads land, in any order (`_run_as_landed`):
        overlap on, a read still in flight, the kernel's pair outputs, and a buffer of pairs x
        hidden floats that stays small."""
        return self.overlap and len(pending) > 1 and any(ev is not None and not ev.is_set() for ev in pending) \
            and self._pairs(pairs)

    def _pairs(self, pairs: int) -> bool:
        """Whether the kernel can run a call in pair rows added in rank order at the end
        (`_run_as_landed`), within a small buffer."""
        return pairs * self.layout.spec.hidden * 4 <= _APART_BYTES and hasattr(self.host, "run_pairs") \
            and self.host.ranks(pairs)

    def _run_as_landed(self, ids: np.ndarray, slots: np.ndarray, pending: list, flat: np.ndarray, x, w, out,
                       hand: Handoff | None = None) -> int:
        """Kernel calls over `ids` (ascending, their `slots`), each over every expert whose
        read has landed by then, in whatever order they land: the hits run while the misses
        are still read (issue 39). Each pair's output goes to its own row of a buffer
        (`run_pairs`), and the rows are added into `out` in the order of the flat ids at the
        end (`combine`): the sum the one-call kernel adds, bit for bit. With a `hand`off, its
        victims run first among the landed and their slots go to the next layer's reads at once."""
        T, K = flat.shape
        y = torch.full((T * K, self.layout.spec.hidden), -0.0)
        # each pair's place in ids and its slot, once (per round: one mask, one where; issue 39:
        # in situ each numpy call of a round cost several times its loop cost)
        pos = np.minimum(np.searchsorted(ids, flat), len(ids) - 1)
        mine = ids[pos] == flat
        slot_pos = slots[pos]
        todo = list(range(len(ids)))
        calls = 0
        while todo:
            ready = [i for i in todo if pending[i] is None or pending[i].is_set()]
            if hand is not None and ready:
                mask = np.zeros(len(ids), bool)
                mask[ready] = True
                ready = np.flatnonzero(hand.first(mask)).tolist()
            if not ready:                            # whichever read lands first runs first
                self.cache.wait_any([pending[i] for i in todo])
                continue
            idx = np.array(ready, np.int64)
            self.cache.landed(ids[idx], [pending[i] for i in ready])       # raises if one of them failed
            done = set(ready)
            todo = [i for i in todo if i not in done]
            if todo:
                self.overlapped += 1
            run = np.zeros(len(ids), bool)
            run[idx] = True
            self.host.run_pairs(x, torch.from_numpy(np.where(mine & run[pos], slot_pos, -1)), y)
            calls += 1
            if hand is not None:
                hand.ran(idx)
        self.host.combine(torch.from_numpy(np.where(mine, flat, -1)), torch.from_numpy(flat), w, y, out)
        return calls

    def _landed_runs(self, ids: np.ndarray, pending: list):
        """Yields (a, b): ids[a:b] have landed, in ascending order, covering all of ids. Each
        run is the longest landed prefix of what is left (waiting for the next read only when
        none has landed), so the experts already in RAM are computed while the rest are still
        being read, and every token's outputs are still added in ascending expert order
        (the module doc): the result is the one-call result, whatever order the reads finish in."""
        n, a = len(ids), 0
        while a < n:
            b = a
            while b < n and (pending[b] is None or pending[b].is_set()):
                b += 1
            if b == a:
                self.cache.landed(ids[a:a + 1], pending[a:a + 1])     # wait for the next one in order
                continue
            self.cache.landed(ids[a:b], pending[a:b])                  # raises if one of them failed
            if b < n:
                self.overlapped += 1
            yield a, b
            a = b

    def _ranked(self, pairs: int) -> bool:
        """Whether the kernel sums a call's outputs in the order of a rank (`CpuExpertExecutor.ranks`)."""
        return getattr(self.host, "ranks", lambda n: False)(pairs)

    def _run(self, ids: np.ndarray, slots: np.ndarray, flat: np.ndarray, x, w, out) -> int:
        """Kernel calls over `ids` (ascending): one where the kernel sums in the order of a
        rank (`flat`, the resident pool's order, whatever the slots), else runs whose slots
        ascend too (see the module doc)."""
        if len(ids) > 1 and self._ranked(flat.size):
            pos = np.minimum(np.searchsorted(ids, flat), len(ids) - 1)
            sid = np.where(ids[pos] == flat, slots[pos], -1)
            self.host.run(x, torch.from_numpy(sid), w, out=out, rank=torch.from_numpy(flat))
            return 1
        breaks = np.flatnonzero(np.diff(slots) <= 0) + 1
        calls = 0
        for run_ids, run_slots in (zip(np.split(ids, breaks), np.split(slots, breaks)) if len(breaks)
                                   else ((ids, slots),)):
            pos = np.searchsorted(run_ids, flat)
            pos = np.minimum(pos, len(run_ids) - 1)
            mine = run_ids[pos] == flat
            sid = np.where(mine, run_slots[pos], -1)
            self.host.run(x, torch.from_numpy(sid), w, out=out)
            calls += 1
        return calls

    def attach_routes(self, routes: dict) -> None:
        """The model's routers by MoE layer (lookahead.model_routes): with lookahead "auto" or
        "router", layer l+1's router guesses its experts from layer l's input."""
        if self.lookahead in ("auto", "router") and routes:
            self.router = RouterLookahead(routes)

    def _predict(self, layer: int, uniq: np.ndarray, x) -> np.ndarray:
        """The experts to read ahead (flat ids, soonest needed first, likeliest first within a
        layer): layer+1's by its router's guess (lookahead.py) or the history predictor's
        (next_layer.py; "auto" reads what the one that has guessed better so far, F1 against what
        the next layers routed, says; the router, while it guesses worse, one call in `GUESS_SAMPLE`,
        `_due`), then the history predictor chained from
        that guess for the layers after it (lookahead.DEPTH). The layers are a cycle: the last
        layer guesses the next token's first (history only: its input is not known yet)."""
        L = self.layout.num_layers
        if self.predictor is None or self.phase == "prefill" \
                or self._quiet >= L:     # a whole pass without a miss or a used read-ahead: nothing to read
            return _NONE
        local = uniq - layer * self.E
        nxt = (layer + 1) % L
        first = nxt * self.E
        routed = self.router.guess(layer, x) if self.router is not None and layer + 1 < L \
            and self._due("router") else None
        # each guess as flat ids once, shared by its score and the reads (only read from: issue 39,
        # in situ each numpy add cost ~5-15 us a call)
        routed_flat = None if routed is None else routed + first
        if routed is not None:
            self.scores["router"].guessed_for(nxt, routed_flat)
        self.predictor.observe(layer, local)        # (learns every call, whoever guesses)
        guess, flat = routed, routed_flat
        if routed is None or self.lookahead == "auto":     # (the history every call: sampled, it read 1.13x the bytes at a 5% cache)
            hist = self.predictor.predict(layer, local)
            hist_flat = hist + first
            self.scores["history"].guessed_for(nxt, hist_flat)
            if routed is None or self.scores["history"].f1() >= self.scores["router"].f1():
                guess, flat = hist, hist_flat
        if layer + 1 < L:           # (the wrap is always the history's guess: not what the mode reads)
            self.source = "router" if guess is routed else "history"
        if len(guess):
            self.score.guessed_for(nxt, flat)
        more = chain(self.predictor, layer, guess, self.depth)
        wide = self.router.runners_up(layer, self.extra) if self.extra and guess is routed else _NONE
        if not more and not len(wide):
            return flat
        return np.concatenate([flat, wide + first, *(g + m * self.E for m, g in more)])

    def _due(self, name: str) -> bool:
        """Whether this call computes `name`'s guess ("router" or "history"): always in "router"
        mode (the history only where the router has no guess); in "auto" every call while it has
        guessed at least as well as the other (F1), one call in `GUESS_SAMPLE` while it has guessed
        worse: its score kept current without both guessers on the decode thread every layer call
        (issue 39: the decode thread's CPU a token)."""
        other = "history" if name == "router" else "router"
        if self.lookahead != "auto" or self.scores[name].f1() > self.scores[other].f1() \
                or (name == "router" and self.scores[name].f1() == self.scores[other].f1()):
            return True
        self._skip[name] = (self._skip[name] + 1) % GUESS_SAMPLE
        return self._skip[name] == 0

    def lookahead_stats(self) -> dict:
        """The guesses (precision/recall vs what the next layer routed) and what reading them
        ahead brought: share of the host cache's would-be misses they covered and the bytes read
        for nothing per byte used."""
        hc = self.cache.c
        S = self._S
        used = hc["prefetch_used"]
        wasted = self.cache.stats()["prefetch_wasted_bytes"]
        return {**self.score.stats(self.source), "mode": self.lookahead,
                **{f"{k}_f1": sc.f1() for k, sc in self.scores.items()},
                "prefetched": hc["prefetches"], "prefetch_used": used,
                "misses_covered": used / (used + hc["misses"]) if used + hc["misses"] else 0.0,
                "cancelled": hc["cancelled"], "budget_cut": hc["budget_cut"],
                "wasted_per_useful": wasted / (used * S) if used else 0.0,
                **{f"prefill_{k}": v for k, v in self.prefill_score.stats("router").items() if k != "source"}}

    def stats(self) -> dict:
        hc = self.cache.stats()
        return self.stats_.as_dict(spec_lookahead=self.expected.stats(), cache={k: hc[k] for k in ("slots", "resident", "evictions", "gib")},
                                   host_cache=hc, disk={"bytes_read": hc["bytes_read"], "reads": hc["reads"],
                                                        "read_s": hc["read_s"], "read_gbs": hc["read_gbs"],
                                                        "errors": hc["read_errors"],
                                                        "pool_gib": self.layout.nbytes / 2**30,
                                                        "b_d_gbs": (self.b_d or 0.0) / 1e9,
                                                        "layer_gap_s": self.gap_s or 0.0,
                                                        "prefetch_cut": self.prefetch_cut,
                                                        "overlapped_runs": self.overlapped,
                                                        "apart_rounds": self.apart,
                                                        "handoffs": self.handoffs,
                                                        **(self.watch.stats() if self.watch is not None
                                                           else {"integrity": "not verified"}),
                                                        "io": self.cache.reader.describe()},
                                   lookahead=self.lookahead_stats(),
                                   kernel_calls=self.kernel_calls)

    # ---- elastic memory (engine/resize.py's `host_cache` component, in GiB like host_cache_gib) ----
    def host_cache_size(self) -> dict:
        c, S = self.cache, self.layout.expert_nbytes
        return {"bytes": c.capacity * S, "slots": c.capacity, "resident": c.resident, "expert_bytes": S,
                "device": "host"}

    def resize_host_cache_bytes(self, nbytes: int) -> dict:
        """Between steps: the host cache gets the whole experts `nbytes` holds. A shrink evicts
        the policy's least valuable residents and returns their memory (background reads land
        first); a grow adds empty slots. A layer call needs one slot (its misses then go one at a
        time), so under one expert is clamped to one slot, and above the pool to the pool."""
        S, n_total = self.layout.expert_nbytes, self.layout.num_layers * self.E
        before, resident_before = self.cache.capacity, self.cache.resident
        slots = nbytes // S
        clamped = ""
        if slots < 1:
            slots, clamped = 1, (f"host_cache_gib: {nbytes / 2**30:g} GiB is less than one expert "
                                 f"({S / 2**20:.2f} MiB); kept 1 slot, the least a layer call needs")
        elif slots > n_total:
            slots, clamped = n_total, f"capped at the whole pool ({n_total} experts)"
        kept = self._resize_slots(slots) if slots != before else resident_before
        return {"before": before * S, "after": slots * S, "slots_before": before, "slots_after": slots,
                "evicted": resident_before - kept, "clamped": clamped}

    def _resize_slots(self, slots: int) -> int:
        """The cache gets `slots` slots (>= 1) and the CPU kernels are rebuilt over the new
        banks; returns the residents kept. Outputs do not change: any cache size gives the
        resident pool's numbers (see the module doc)."""
        kept = self.cache.resize(slots)
        getattr(self.host, "close", lambda: None)()
        self.host = self._executor(*self._threads)
        return kept

    def close(self) -> None:
        self.cache.close()
        if self.watch is not None:
            self.watch.close()
        getattr(self.host, "close", lambda: None)()
