"""The slot table: which expert sits in which of N cache slots, the replacement policy, and
the victims. No banks: the engine's `ExpertCache` adds the device memory and the copies on
top of it, and `freetoken sim` drives the very same table, so a projection replays the
engine's own residency decisions.

  slot_of[flat]  -> slot or -1          (residency table, [L*E]; flat = layer*E + expert)
  owner[slot]    -> flat id or -1       (reverse map)
  stamp[slot]    -> last use, -1 empty  (recency: every touch takes a fresh clock value)
  locks[slot]    -> users this step     (locked slots are never victims)
  pending[slot]  -> a fill is in flight (not yet readable, not evictable)

Policies (`expert_cache_policy`), all keyed per slot, ties to the least recently used:
  lru    one global LRU over all layers
  lfu    perfect LFU: every routed access counts, counts survive eviction
  lrfu   LRFU (Lee et al. 2001): the exponentially decayed access count, half-life
         `half_life` tokens (a token = one pass through the layer stack: time ticks when
         the accessed layer is lower than the previous one)
  arc    ARC (Megiddo & Modha 2003): recency list T1 and frequency list T2 with ghost lists
         and an adaptive split (experts/memory/arc.py); its own victim order, not a score
Frequencies count every routed access (`record`), hit or miss, as the engine sees them.

Layer-aware eviction ("+layer", not with arc): a decode step runs the layers in order, so when
the experts a step routes (its working set: the unique ids of the last full pass, or of this
pass so far, counted by `record`) do not fit the slots, any order by recency or frequency evicts exactly the layers
needed next and a cyclic stream misses every time. Then the victims are ordered by next use
first (`next_use`: the layer just run is needed furthest ahead), the policy's score and
recency only within a layer; when the working set fits, the policy's order is unchanged.
On a layer-cyclic stream (every pass routes the same experts) that is Belady's choice
(tests/experts/test_layer_aware.py checks it against a brute-force Belady).

Kept layers (`keep`, not a policy name: the disk tier keeps layer 0, experts/disk/backend.py
KEEP_FIRST): while the slots hold a step's working set and the kept layers' whole expert sets
besides, every other evictable slot is a victim before a kept layer's resident; the victims are
otherwise in the policy's order. A decode step's first layer has no router guess (its input is
not known a layer ahead) and its reads overlap no compute, so its misses are the ones that block.

Admission control ("+admit"): in the hybrid split, a decode miss is filled only when its
policy score beats the victim it would replace; otherwise it runs on the CPU (the engine's
other branch) and the cache keeps the entry that is likelier to be reused. `offload` and
prefill still fill every miss. Under LRU the score is recency, so a miss (the newest
access) is always admitted; under ARC a miss is admitted when it is in a ghost list (seen
recently) or a slot is empty, and a declined one is remembered in B1 (ARC with bypass).

Prefetch ("+prefetch", decode only): after each decode layer call the table guesses the
next layer's experts from this layer's routing (experts/memory/next_layer.py, learnt online) and
`prefetch_after` names the guesses that are not resident and the slots they take (the
policy's victims); the caller copies them in the background. Every prefetch is a
transfer (`prefetches` counts them); a guess that is wrong costs that copy and a victim.

Transfer budget ("+budget", after "+prefetch"): prefetch only within `prefetch_budget.RATIO` x the
copies the cache would have made without guessing (experts/memory/prefetch_budget.py), at the
lower threshold that budget affords (`prefetch_budget.THRESHOLD`), likeliest guesses first.

Prompt-weighted frequency ("+prompt", last, lrfu only): a prefill layer call adds to each expert's
count the recency-weighted share of the prompt tokens that routed it (in (0, 1]) instead of 1
(experts/memory/prompt_weight.py; the shares come with the call's rows, `learn_prompt`, before
its `record`), so the prompt's stale experts are the first victims of the decode misses.

Path prefetch ("+path", last, after "+prefetch"): the next-layer guess reads the token's path, the
experts it routed at the last `PATH_HOPS` layers, not only the layer just run (experts/memory/
next_layer.py, `hops`): with few experts a token (gpt-oss: top-2 of 128) one layer says little.
"""
from __future__ import annotations

import math

import numpy as np

from ... import kernels
from .arc import ArcLists
from .next_layer import PATH_HOPS, THRESHOLD, NextLayerPredictor
from .prefetch_budget import THRESHOLD as BUDGET_THRESHOLD, TransferBudget
from .prompt_weight import prompt_shares


def slots_in(nbytes: int, expert_bytes: int, total: int) -> int:
    """Whole experts `nbytes` holds, at most `total` (the pool): the one GiB -> slots rule of the
    device cache, at start (`cache_choice`) and at a runtime resize."""
    return max(0, min(total, nbytes // expert_bytes))

POLICIES = ("lru", "lfu", "lrfu", "arc")
# measured (bench/policy_bounds.py, docs/benchmarks.md "Path prefetch"): on the 7 shared traces at
# 11/37% capacity, <= 0.85x LRU's decode misses with <= 1.1x LRU's transfers in 14 of 14 cells
# (without '+path': 13; without '+prompt' too: 12; lrfu+admit+layer: 3). The disk tier's host cache
# takes only the base and '+layer' (its read-ahead is its own lookahead).
DEFAULT_POLICY = "lrfu+admit+layer+prefetch+budget+prompt+path"
HALF_LIFE_TOKENS = 32.0
_NEVER = np.iinfo(np.int64).max
# a few victims of a large table in one C call (kernels/c/slot_victims.c, the same slots in the same
# order as `_few_candidates`); False: numpy (tests force either)
C_VICTIMS = True
_FEW = 16       # `read_ahead_victims`: up to this many in Python ints (~17 numpy calls on a few ids otherwise)


def parse_policy(name: str) -> tuple[str, bool]:
    """'lrfu', 'lfu+admit', 'lrfu+admit+prefetch', ... -> (policy, admission); unknown names
    raise ValueError."""
    base, admit, _ = parse_policy_options(name)
    return base, admit


EXTRAS = ("admit", "layer", "prefetch", "budget", "prompt", "path")        # in this order


def parse_policy_options(name: str) -> tuple[str, bool, bool]:
    """-> (policy, admission, prefetch); '+layer' (layer-aware eviction) is `layer_aware(name)`,
    '+budget' (prefetch within a transfer budget) `budgeted(name)`."""
    base, *extras = name.split("+")
    if base not in POLICIES or len(set(extras)) != len(extras) or any(e not in EXTRAS for e in extras) \
            or extras != sorted(extras, key=EXTRAS.index) or ("layer" in extras and base == "arc") \
            or ("budget" in extras and "prefetch" not in extras) or ("prompt" in extras and base != "lrfu") \
            or ("path" in extras and "prefetch" not in extras):
        raise ValueError(f"expert cache policy {name!r}: expected one of {', '.join(POLICIES)}, "
                         "optionally with '+admit', then '+layer' (not with arc), then '+prefetch', "
                         "then '+budget' (only after '+prefetch'), then '+prompt' (lrfu only), "
                         "then '+path' (only after '+prefetch')")
    return base, "admit" in extras, "prefetch" in extras


def without_prefetch(name: str) -> str:
    """The policy without '+prefetch' (and its '+budget', '+path'): where nothing may be copied ahead."""
    return "+".join(x for x in name.split("+") if x not in ("prefetch", "budget", "path"))


def budgeted(name: str) -> bool:
    """Whether the policy name asks for prefetch within a transfer budget ('+budget')."""
    return "budget" in name.split("+")[1:]


def prompt_weighted(name: str) -> bool:
    """Whether the policy name asks for prompt-weighted frequency ('+prompt')."""
    return "prompt" in name.split("+")[1:]


def path_hops(name: str) -> int:
    """The layers the next-layer guess reads: `PATH_HOPS` with '+path', else 1."""
    return PATH_HOPS if "path" in name.split("+")[1:] else 1


def layer_aware(name: str) -> bool:
    """Whether the policy name asks for layer-aware eviction ('+layer')."""
    return "layer" in name.split("+")[1:]


class SlotTable:
    def __init__(self, num_flat: int, num_experts: int, slots: int, policy: str = DEFAULT_POLICY,
                 half_life: float = HALF_LIFE_TOKENS, prefetch_threshold: float | None = None):
        self.policy, self.admission, prefetch = parse_policy_options(policy)
        self.layer_aware = layer_aware(policy)
        self.prompt_weighted = prompt_weighted(policy)
        self.half_life = float(half_life)
        self.budget = TransferBudget(num_flat) if budgeted(policy) else None
        if prefetch_threshold is None:
            prefetch_threshold = THRESHOLD if self.budget is None else BUDGET_THRESHOLD
        self.num_experts = num_experts
        self.num_layers = max(1, num_flat // max(1, num_experts))
        self.working_set = 0           # unique experts of the last full pass through the layers (a step)
        self._pass_count = 0           # ... of the pass under way
        self._cur_layer = -1           # the layer being accessed now (every policy tracks it)
        self.layer_ordered = 0         # victim choices made in next-use order (the step did not fit)
        self.name = policy
        self.predictor = (NextLayerPredictor(num_flat // num_experts, num_experts, prefetch_threshold,
                                             hops=min(path_hops(policy), self.num_layers)) if prefetch else None)
        self.prefetches = 0
        self.slot_of = np.full(num_flat, -1, np.int64)
        self.count = np.zeros(num_flat, np.float64)    # lfu: accesses; lrfu: decayed score at `since`
        self.since = np.zeros(num_flat, np.int64)      # lrfu: the token of the last access
        # lrfu's keep-priority by id, log(count) + rate*since, set as `record` changes them (the
        # victims read it for ~2400 slots a layer call: np.log of them all cost ~10-20 us each time)
        self.keyscore = np.full(num_flat, -np.inf)
        self.build = "native" if C_VICTIMS else None    # the kernel build `_c_candidates` calls; None: numpy
        self.prompt_share = np.full(num_flat, np.nan)  # '+prompt': the next prefill record's add, per id
        self.rate = math.log(2) / half_life
        self.token, self.last_layer = 0, -1
        self.clock = 0
        self.evictions = 0
        self.arc = ArcLists(slots) if self.policy == "arc" else None
        # layers whose residents are the last victims while the slots hold a step's working set
        # and these layers whole (`_kept`; not with arc): the disk tier keeps layer 0, whose
        # misses no router guess covers (experts/disk/backend.py KEEP_FIRST)
        self.keep(())
        self.reset(slots)

    def reset(self, slots: int) -> None:
        if slots < 0:
            raise ValueError(f"expert cache slots must be >= 0, got {slots}")
        self.capacity = int(slots)
        self.slot_of[:] = -1
        self.owner = np.full(self.capacity, -1, np.int64)
        self.stamp = np.full(self.capacity, -1, np.int64)
        self.locks = np.zeros(self.capacity, np.int32)
        self.pending = np.zeros(self.capacity, bool)
        self._addr = None           # `_c_candidates`' arrays and their addresses

    # ---- lookup, accesses and recency -----------------------------------------------
    def lookup(self, flat_ids: np.ndarray) -> np.ndarray:
        return self.slot_of[flat_ids]

    def record(self, flat_ids: np.ndarray) -> None:
        """Count one routed access of each id (one layer's unique ids, hits and misses)."""
        if len(flat_ids) == 0:
            return
        if self.budget is not None:
            self.budget.seen(flat_ids, self.slot_of[flat_ids] >= 0)
        # (several layer calls of one pass may come at once, layers ascending: the host cache's
        # hits, recorded in a batch; the pass and the token turn only at the first)
        layer, last = int(flat_ids[0]) // self.num_experts, int(flat_ids[-1]) // self.num_experts
        if layer < self._cur_layer:                 # a new pass through the layers
            self.working_set, self._pass_count = self._pass_count, 0
        self._pass_count += len(flat_ids)
        self._cur_layer = last
        if self.policy == "lru":
            return
        if self.arc is not None:
            self.arc.seen(flat_ids)
            return
        if layer < self.last_layer:
            self.token += 1
        self.last_layer = last
        if self.policy == "lfu":
            self.count[flat_ids] += 1.0
        else:
            add = 1.0
            if self.prompt_weighted:        # a prefill call's ids carry their prompt share (once)
                share = self.prompt_share[flat_ids]
                add = np.where(np.isnan(share), 1.0, share)
                self.prompt_share[flat_ids] = np.nan
            count = self.count[flat_ids] * np.exp(-self.rate * (self.token - self.since[flat_ids])) + add
            self.count[flat_ids] = count
            self.since[flat_ids] = self.token
            with np.errstate(divide="ignore"):      # (log(score) + rate*token orders scores at any later time)
                self.keyscore[flat_ids] = np.log(count) + self.rate * self.token

    def touch(self, slots: np.ndarray) -> None:
        n = len(slots)
        self.stamp[slots] = np.arange(self.clock + 1, self.clock + 1 + n)
        self.clock += n

    def lock(self, slots: np.ndarray) -> None:
        np.add.at(self.locks, slots, 1)

    def unlock(self, slots: np.ndarray) -> None:
        np.add.at(self.locks, slots, -1)

    def score(self, flat_ids: np.ndarray) -> np.ndarray:
        """The policy's keep-priority of each id (higher = keep); lru: none (all equal)."""
        if self.policy == "lfu":
            return self.count[flat_ids]
        if self.policy == "lrfu":   # log(count) + rate*since, kept by `record`
            return self.keyscore[flat_ids]
        return np.zeros(len(flat_ids))

    def describe(self) -> dict:
        """The policy and its switches, for /v1/memory (the name) and /metrics (the numbers)."""
        return {"policy": self.name, "layer_aware": int(self.layer_aware), "admission": int(self.admission),
                "prompt_weighted": int(self.prompt_weighted),
                "prefetch": int(self.predictor is not None), "working_set": self.working_set,
                "path_hops": self.predictor.hops if self.predictor is not None else 0,
                "layer_ordered": self.layer_ordered, **(self.budget.describe() if self.budget is not None else {})}

    def lru_order(self) -> list[int]:
        """Resident flat ids, least recent first (for tests and resize)."""
        used = np.flatnonzero(self.owner >= 0)
        return self.owner[used[np.argsort(self.stamp[used])]].tolist()

    @property
    def resident(self) -> int:
        return int((self.owner >= 0).sum())

    def evictable(self) -> int:
        return int(((self.locks == 0) & ~self.pending).sum())

    # ---- victims, admission and fills ---------------------------------------------------
    def candidates(self, k: int, incoming: np.ndarray | None = None) -> np.ndarray:
        """Up to k evictable slots, first victim first: empty slots, then the least score,
        ties to the least recently used (arc: its REPLACE order; `incoming`, the misses to be
        filled in order, settles the paper's tie)."""
        if k <= 0 or self.capacity == 0:
            return np.empty(0, np.int64)
        used = self.owner >= 0
        free = (self.locks == 0) & ~self.pending
        if self.arc is not None:
            empty = np.flatnonzero(~used & free)[:k]
            evictable = set(self.owner[used & free].tolist())
            rest = incoming[len(empty):] if incoming is not None else ()
            victims = self.arc.order(evictable, k - len(empty), rest)
            return np.concatenate([empty, self.slot_of[np.asarray(victims, np.int64)]]).astype(np.int64)
        ordered = self.layer_aware and max(self.working_set, self._pass_count) > self.capacity
        self.layer_ordered += ordered
        lib = kernels.load(self.build) if self.build else None     # (None where nothing builds here)
        if lib is not None and k < self.capacity // 8:
            return self._c_candidates(lib, k, ordered)
        kept = self._kept(used, ordered)
        if kept is None:
            return self._order(k, used, free, ordered)
        first = self._order(k, used, free & ~kept, ordered)      # the kept layers' slots only when
        if len(first) == k:                                       # nothing else can be given up
            return first
        return np.concatenate([first, self._order(k - len(first), used, free & kept, ordered)])

    def _c_candidates(self, lib, k: int, ordered: bool) -> np.ndarray:
        """`candidates`' first k (not arc) in one C call: the same slots in the same order."""
        arrays = (self.owner, self.stamp, self.locks, self.pending, self._kept_flat)
        if self._addr is None or any(a is not b for a, b in zip(arrays, self._addr[0])):
            self._addr = self._addresses(arrays)
        _, out, (owner, stamp, locks, pending, kept, score, to) = self._addr
        n = lib.ft_slot_victims(self.capacity, owner, stamp, locks, pending, score,
                                kept if self._keeps(ordered) else None,
                                self.num_layers if ordered else 0, self.num_experts, self._cur_layer, k, to)
        if n < 0:
            raise MemoryError("expert cache victims: out of memory")
        return out[:n].copy()

    def _addresses(self, arrays: tuple) -> tuple:
        """(the arrays, the output buffer, their addresses and the score's): taken once, since
        `.ctypes.data` costs ~1.5 us a use, 7 of them ~3x the C call."""
        score = self.count if self.policy == "lfu" else self.keyscore if self.policy == "lrfu" else None
        out = np.empty(max(1, self.capacity // 8), np.int64)
        return arrays, out, [*(a.ctypes.data for a in arrays), None if score is None else score.ctypes.data,
                             out.ctypes.data]

    def _keeps(self, ordered: bool) -> bool:
        """Whether the kept layers' residents go last now (`_kept`)."""
        return bool(self.keep_layers) and not ordered and \
            self.capacity >= max(self.working_set, self._pass_count) + len(self.keep_layers) * self.num_experts

    def _kept(self, used: np.ndarray, ordered: bool) -> np.ndarray | None:
        """The slots of `keep_layers`' residents (evicted after every other evictable slot), or
        None: no layer kept, or the slots do not hold a step's working set and those layers'
        whole expert sets besides (then the policy's order alone, as without)."""
        if not self._keeps(ordered):
            return None
        return used & self._kept_flat[self.owner]       # (an empty slot's -1 reads the last id: masked)

    def keep(self, layers) -> None:
        """Keep `layers`' residents as the last victims (`keep_layers`); () for none."""
        self.keep_layers = tuple(sorted(set(int(x) for x in layers)))
        self._kept_flat = np.zeros(len(self.slot_of), bool)
        for layer in self.keep_layers:
            self._kept_flat[layer * self.num_experts:(layer + 1) * self.num_experts] = True

    def _order(self, k: int, used: np.ndarray, free: np.ndarray, ordered: bool) -> np.ndarray:
        """Up to k of the `free` slots, first victim first (`candidates` without arc)."""
        if k <= 0:
            return np.empty(0, np.int64)
        if k < self.capacity // 8:        # a few victims of a large table: only the likely ones sorted
            return self._few_candidates(k, used, free, ordered)
        empty = np.where(used, 0, np.arange(self.capacity) - self.capacity - 1)   # empty slots first, in order
        prio = np.zeros(self.capacity)
        prio[used] = self.score(self.owner[used])
        keys = [np.where(used, self.stamp, empty), prio]
        if ordered:
            keys.append(-self.next_use(self.owner))          # furthest next use first
        order = np.lexsort((*keys, used))
        order = order[free[order]]
        return order[:k]

    def _few_candidates(self, k: int, used: np.ndarray, free: np.ndarray, ordered: bool) -> np.ndarray:
        """`candidates`' first k, the same slots in the same order, without sorting the whole
        table (issue 39: a 48-layer host cache of ~2400 slots was lexsorted for every layer call's
        few misses and guesses): free empty slots first, then of the free used ones only those
        whose most significant key is within the k smallest (the k first in the full order all
        are), sorted by the full keys (stamps are unique, so the order is total)."""
        empties = np.flatnonzero(~used & free)
        if len(empties) >= k:
            return empties[:k]
        rest = np.flatnonzero(used & free)
        need = k - len(empties)
        owners = self.owner[rest]
        keys = [self.stamp[rest], self.score(owners)]
        if ordered:
            keys.append(-self.next_use(owners))
        if need < len(rest):
            lead = keys[-1] if ordered or self.policy in ("lfu", "lrfu") else keys[0]   # (lru: no score)
            # the need-th smallest of an evenly spaced sample bounds the table's need-th smallest
            # from above (a partition of the whole table cost ~30 us of 2400 slots, the sample's ~3)
            sample = lead[::max(1, len(lead) // (32 * need))]
            near = lead <= np.partition(sample, need - 1)[need - 1]
            rest, keys = rest[near], [key[near] for key in keys]
        return np.concatenate([empties, rest[np.lexsort(keys)[:need]]])

    def read_ahead_victims(self, want: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids, slots): a read ahead of `want` (not resident, soonest needed first) into the
        policy's victims, doing no harm (Cao et al. 1995): never into the slot of an expert
        needed as soon as the one it brings or sooner (`next_use`), which would only trade this
        read for a later one; empty slots always."""
        slots = self.candidates(len(want), want)
        want = want[:len(slots)]
        if len(want) > _FEW:
            owners = self.owner[slots]
            ok = (owners < 0) | (self.next_use(owners) > self.next_use(want))
            return (want, slots) if ok.all() else (want[ok], slots[ok])
        L, E, cur = self.num_layers, self.num_experts, self._cur_layer     # a layer call's few: ints
        ok = [o < 0 or ((o // E - cur) % L or L) > ((w // E - cur) % L or L)       # (`next_use`)
              for o, w in zip(self.owner[slots].tolist(), want.tolist())]
        if all(ok):
            return want, slots
        ok = np.array(ok, bool)
        return want[ok], slots[ok]

    def next_use(self, flat_ids: np.ndarray) -> np.ndarray:
        """Layer calls until each id's layer comes round again, counted from the layer being
        accessed now (its own layer: a whole pass, L): in a decode step the layers run in order,
        so the layer just run is the one needed furthest ahead."""
        layer = np.maximum(flat_ids, 0) // self.num_experts
        d = (layer - self._cur_layer) % self.num_layers
        return np.where(d == 0, self.num_layers, d)

    def admit(self, flat_ids: np.ndarray, victims: np.ndarray) -> np.ndarray:
        """Which of the misses `flat_ids` (in fill order) may replace `victims` (candidates'
        order): all without admission control; with it, a miss is admitted when its score
        beats the victim's, an empty slot always."""
        n = min(len(flat_ids), len(victims))
        ok = np.zeros(len(flat_ids), bool)
        if not self.admission or self.policy == "lru":
            ok[:n] = True
            return ok
        if self.arc is not None:
            for i in range(n):
                ok[i] = self.owner[victims[i]] < 0 or self.arc.ghost(int(flat_ids[i]))
                if not ok[i]:
                    self.arc.declined(int(flat_ids[i]))
            return ok
        owners = self.owner[victims[:n]]
        mine = self.score(flat_ids[:n])
        theirs = np.where(owners >= 0, self.score(np.maximum(owners, 0)), -np.inf)
        ok[:n] = mine > theirs
        return ok

    def assign(self, flat_ids: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """Evict the slots' owners and map flat_ids into them: most recent, locked, pending
        (until `ready`). Returns the evicted flat ids."""
        old = self.owner[slots]
        gone = old[old >= 0]
        if self.arc is not None:
            for x, v in zip(flat_ids.tolist(), old.tolist()):
                self.arc.filled(x, v)
        self.slot_of[gone] = -1
        self.evictions += len(gone)
        if self.budget is not None:
            self.budget.copied(len(flat_ids), gone)
        self.owner[slots] = flat_ids
        self.slot_of[flat_ids] = slots
        self.touch(slots)
        self.lock(slots)
        self.pending[slots] = True
        return gone

    def ready(self, slots: np.ndarray) -> None:
        self.pending[slots] = False

    def serve(self, flat_ids: np.ndarray, admission: bool = False) -> np.ndarray:
        """One layer call whose fills land at once (`freetoken sim`, tests): count the accesses,
        lock and touch the hits, take victims for the misses while the whole call is locked
        (with `admission`, declined misses stay out), fill, unlock. Returns the hit mask. The
        engine's caches take the same steps with real reads in between (host_cache.py, decision.py)."""
        ids = np.asarray(flat_ids, np.int64)
        self.record(ids)
        slots = self.slot_of[ids]
        hit = slots >= 0
        held = slots[hit]
        self.lock(held)
        self.touch(held)
        miss = ids[~hit]
        victims = self.candidates(len(miss), miss)
        if admission and len(victims):
            ok = self.admit(miss[:len(victims)], victims)
            miss, victims = miss[:len(victims)][ok], victims[ok]
        miss = miss[:len(victims)]
        self.assign(miss, victims)
        self.ready(victims)
        self.unlock(np.concatenate([held, victims]))
        return hit

    def learn_prompt(self, layer: int, rows: np.ndarray) -> None:
        """A prefill layer call's per-token routed ids (within the layer, prompt order), before
        its `record`: "+prefetch": they teach the next-layer predictor; "+prompt": they give the
        shares that record adds (any share still unrecorded is dropped: a call that never recorded)."""
        if self.predictor is not None:
            self.predictor.observe_tokens(layer, rows)
        if self.prompt_weighted:
            E = self.num_experts
            self.prompt_share[:] = np.nan
            share = prompt_shares(rows, E, self.half_life)
            routed = np.flatnonzero(share > 0)
            self.prompt_share[layer * E + routed] = share[routed]

    def prefetch_after(self, flat_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """After a decode layer call routed `flat_ids` (one layer's unique ids): learn from
        them and return (next-layer ids to prefetch, their victim slots), likeliest first;
        the caller assigns them (a transfer each). Empty without "+prefetch"."""
        empty = np.empty(0, np.int64)
        if self.predictor is None or len(flat_ids) == 0:
            return empty, empty
        E = self.num_experts
        layer = int(flat_ids[0]) // E
        local = np.asarray(flat_ids, np.int64) - layer * E
        self.predictor.observe(layer, local)
        return self.claim_prefetch(self.predictor.predict(layer, local) + (layer + 1) * E)

    def claim_prefetch(self, want: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids, slots): of the guessed flat ids `want`, those not resident that the transfer
        budget allows and slots can be found for, with their candidate slots."""
        want = want[self.slot_of[want] < 0]
        if self.budget is not None:
            want = want[:self.budget.room()]
        slots = self.candidates(len(want), want)
        want = want[:len(slots)]
        self.prefetches += len(slots)
        if self.budget is not None:
            self.budget.prefetched(want)
        return want, slots

    def keep_most_recent(self, slots: int) -> np.ndarray:
        """Rebuild for `slots` slots keeping the most recent residents in slots 0..n-1 (least
        recent first); returns the old slot of each kept one (for moving bank rows)."""
        if self.locks.any():
            raise RuntimeError("expert cache resize outside a safe point (slots are in use)")
        used = np.flatnonzero(self.owner >= 0)
        keep = used[np.argsort(-self.stamp[used])][:max(int(slots), 0)]
        return self._rebuild(keep[np.argsort(self.stamp[keep])], slots)

    def keep_best(self, slots: int) -> np.ndarray:
        """Rebuild for `slots` slots keeping the residents the policy values most (those
        `candidates` would evict last), in their old slot order in slots 0..n-1; returns their
        old slots. Ascending old slots let a caller move bank rows in place (new <= old)."""
        if self.locks.any() or self.pending.any():
            raise RuntimeError("cache resize outside a safe point (slots are in use or being filled)")
        order = self.candidates(self.capacity)            # every slot, first victim first
        order = order[self.owner[order] >= 0]
        return self._rebuild(np.sort(order[max(0, len(order) - max(int(slots), 0)):]), slots)

    def _rebuild(self, keep: np.ndarray, slots: int) -> np.ndarray:
        owner, stamp = self.owner[keep], self.stamp[keep]
        self.reset(slots)
        n = len(keep)
        self.owner[:n], self.stamp[:n] = owner, stamp
        self.slot_of[owner] = np.arange(n)
        if self.budget is not None:
            self.budget.keep_only(self.slot_of >= 0)
        if self.arc is not None:
            self.arc.keep(set(owner.tolist()), self.capacity)
        return keep

    def check(self) -> None:
        """Invariants (tests call this after every operation)."""
        res = np.flatnonzero(self.slot_of >= 0)
        assert len(res) <= self.capacity
        assert np.array_equal(self.owner[self.slot_of[res]], res), "residency table != reverse map"
        used = self.owner[self.owner >= 0]
        assert len(np.unique(used)) == len(used), "an expert occupies two slots"
        assert np.array_equal(np.sort(self.slot_of[used]), np.flatnonzero(self.owner >= 0))
        assert (self.locks >= 0).all()
        if self.arc is not None:
            self.arc.check(set(used.tolist()))
