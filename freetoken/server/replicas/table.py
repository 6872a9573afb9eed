"""Which replica holds which prompt prefix, and the routing rule (no Ray in here).

A prompt's key is the chain of its token blocks' hashes, with the engine's KV block size:
h_k = hash(h_{k-1}, tokens[k*bs:(k+1)*bs]) names the whole prefix tokens[:(k+1)*bs], so a
replica that holds h_k holds that prefix, as the engine's radix tree does (one node per
full block, matched from the root). Per replica the table keeps the hashes of the prompts
it was sent (recorded when a request is routed there), least recently used first, at most
the replica's KV blocks; when a replica reports that its prefix cache evicted n blocks, its
n least recently used hashes go too. A prompt's blocks are recorded deepest first, so the
first to go are the deepest blocks of the oldest prompt: the engine, too, evicts the
unreferenced leaves of its tree, oldest first. A replica that dies is dropped whole."""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import xxhash


def block_hashes(token_ids, block_size: int) -> list[int]:
    """Chain hashes of the full blocks of token_ids (a partial last block has none)."""
    ids = np.asarray(token_ids, dtype=np.int64)
    out, h = [], 0
    for k in range(len(ids) // block_size):
        x = xxhash.xxh3_64(ids[k * block_size:(k + 1) * block_size].tobytes(), seed=h)
        h = x.intdigest()
        out.append(h)
    return out


class PrefixTable:
    """Replica -> the block-chain hashes it holds; thread-safe (the Ray router and the
    front end update it from two threads)."""

    def __init__(self, default_capacity_blocks: int = 1 << 20):
        self.default_capacity = default_capacity_blocks
        self._held: dict[str, OrderedDict] = {}      # replica -> hash -> None, LRU first
        self._capacity: dict[str, int] = {}
        self._evicted_seen: dict[str, int] = {}      # the replica's eviction counter last reported
        self._lock = threading.Lock()

    def replicas(self) -> list[str]:
        with self._lock:
            return list(self._held)

    def add_replica(self, r: str) -> None:
        with self._lock:
            self._held.setdefault(r, OrderedDict())

    def drop(self, r: str) -> None:
        with self._lock:
            self._held.pop(r, None)
            self._capacity.pop(r, None)
            self._evicted_seen.pop(r, None)

    def size(self, r: str) -> int:
        with self._lock:
            return len(self._held.get(r, ()))

    def sizes(self) -> dict[str, int]:
        with self._lock:
            return {r: len(h) for r, h in self._held.items()}

    def set_capacity(self, r: str, blocks: int) -> None:
        with self._lock:
            if r in self._held and blocks > 0:
                self._capacity[r] = int(blocks)
                self._trim(r)

    def insert(self, r: str, hashes: list[int]) -> None:
        """The replica was sent this prompt: it will hold all of its full blocks."""
        with self._lock:
            held = self._held.setdefault(r, OrderedDict())
            for h in reversed(hashes):               # deepest first: the root end stays freshest
                held[h] = None
                held.move_to_end(h)
            self._trim(r)

    def evicted(self, r: str, counter: int) -> int:
        """The replica's prefix cache has evicted `counter` blocks since it started: forget
        as many of its least recently used blocks as were evicted since the last report."""
        with self._lock:
            held = self._held.get(r)
            if held is None:
                return 0
            last = self._evicted_seen.get(r)
            self._evicted_seen[r] = counter
            n = 0 if last is None else max(0, counter - last)
            for _ in range(min(n, len(held))):
                held.popitem(last=False)
            return n

    def match(self, r: str, hashes: list[int]) -> int:
        """Leading blocks of the key that replica r holds."""
        with self._lock:
            return self._match(self._held.get(r, {}), hashes)

    def matches(self, hashes: list[int], replicas=None) -> dict[str, int]:
        with self._lock:
            rs = list(self._held) if replicas is None else replicas
            return {r: self._match(self._held.get(r, {}), hashes) for r in rs}

    @staticmethod
    def _match(held, hashes) -> int:
        n = 0
        for h in hashes:
            if h not in held:
                break
            n += 1
        return n

    def _trim(self, r: str) -> None:
        held, cap = self._held[r], self._capacity.get(r, self.default_capacity)
        while len(held) > cap:
            held.popitem(last=False)


@dataclass(frozen=True)
class Choice:
    replica: str
    reason: str          # "prefix" | "session" | "least-loaded" | "spill"
    matched_blocks: int


def choose(matches: dict[str, int], loads: dict[str, int], session_replica: str | None,
           queue_bound: int, held: dict[str, int] | None = None) -> Choice | None:
    """The routing rule. Among the live replicas (the keys of `loads`):
    1. a session's request goes to the session's replica when no other replica holds a
       longer prefix of its prompt: sessions stick, whatever the load (their history is
       cached there alone; moving one re-prefills all of it, and a replica that is full
       is still skipped by Ray's `max_ongoing_requests`);
    2. any other request to the replica holding the longest prefix of the prompt (ties: the
       least loaded), or with no prefix anywhere to the least loaded;
    3. unless that replica has more than `queue_bound` requests in flight beyond the least
       loaded one: then the least loaded (ties: the longer prefix). A new session whose
       only match is a shared system prompt thus goes where the load is, and pays that
       prompt once per replica, not its history on every spill.
    Ties in load go to the replica holding fewer blocks (`held`: so new sessions that come
    one at a time still alternate), then to the smaller replica id (deterministic)."""
    if not loads:
        return None
    live = sorted(loads)
    m = {r: matches.get(r, 0) for r in live}
    size = {r: (held or {}).get(r, 0) for r in live}
    least = min(live, key=lambda r: (loads[r], -m[r], size[r], r))
    best = max(m.values())
    if session_replica in loads and m[session_replica] == best:
        return Choice(session_replica, "session", best)
    if best > 0:
        pick = min((r for r in live if m[r] == best), key=lambda r: (loads[r], size[r], r))
        reason = "prefix"
    else:
        pick, reason = least, "least-loaded"
    if loads[pick] - loads[least] > queue_bound:
        pick, reason = least, "spill"
    return Choice(pick, reason, m[pick])


class Sessions:
    """Session id -> the replica that served it last (bounded, oldest forgotten first)."""

    def __init__(self, limit: int = 100_000):
        self.limit = limit
        self._map: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, session: str | None) -> str | None:
        if not session:
            return None
        with self._lock:
            return self._map.get(session)

    def set(self, session: str | None, r: str) -> None:
        if not session:
            return
        with self._lock:
            self._map[session] = r
            self._map.move_to_end(session)
            while len(self._map) > self.limit:
                self._map.popitem(last=False)

    def drop_replica(self, r: str) -> int:
        """Forget the sessions of a dead replica (they are routed afresh); how many."""
        with self._lock:
            gone = [s for s, x in self._map.items() if x == r]
            for s in gone:
                del self._map[s]
            return len(gone)
