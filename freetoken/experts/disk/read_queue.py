"""The host cache's reads in priority order: a layer call's demand reads go before read-ahead
guesses, and a guess that has not started yet can be cancelled.

Issue 39: on spread routing half the router's guesses were wrong, and in a first-come pool their
reads sat ahead of the misses a layer call waited for (1.1-1.3 GB of 4.4-4.8 GB read for nothing
on the 4-layer file at a 5% host cache). Here a demand read always starts before any queued guess,
a guess that the call it was for turns out to need is promoted to a demand read, and one it does
not need is dropped before it reads a byte (`HostExpertCache.cancel_guesses`).

`threads` reader threads of its own wait on one condition: a layer call's reads are queued under
one lock and wake only as many readers as reads (`put_many`), and each reader takes whichever
queued read ranks first; with `reserve` (the host cache's) one more reader takes demand reads
only. (A thread pool's task a read cost the decode thread a future, a queue put and a wake-up
per read: 38-42 us for a call's 8 reads against 17-20 now, issue 39.)"""
from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import weakref
from typing import Callable

log = logging.getLogger("freetoken.experts")

DEMAND, GUESS = 0, 1        # priorities: a layer call waits for its demand reads; guesses may be wrong
_STOP = object()            # `ReadQueue.take`: the reader stops
# guess reads that may start while a demand read is queued or being read (a miss shares the disk
# with every read in flight: 1.69 GB/s at depth 1, 2.22 at 4 at stop 46); None: as many as there are
# readers. Off: at 1, under load 7-10 (docs/benchmarks.md, `disk39`), the 12-layer file's time
# blocked on reads fell to 0.59x but the 48-layer target's did not move (15.0 against 13.7 ms a
# token, medians of 3); `bench/disk_tier.py --guesses-beside-demand 1` for the quiet A/B
GUESSES_BESIDE_DEMAND: int | None = None
# readers under SCHED_BATCH (Linux): a reader whose read lands does not preempt the running thread
# at its wake-up, it runs when a core is free (the decode thread blocked on a read, the kernel pool's
# worker yielding between calls) or at the next slice; on a 2-core box a reader woken mid kernel
# call took a pool thread's core while the other waited at the call's barrier. "all": every reader;
# "guesses": all but the demand-only reader; None: none. Off: every reader batch blocked the 48-layer
# decode 2.5x longer on reads (docs/benchmarks.md, `disk39`); `bench/disk_tier.py --readers-batch`
READERS_BATCH: str | None = None


class ReadQueue:
    def __init__(self, threads: int, read: Callable[[int, int], None], reserve: bool = False):
        self._read = read                       # read(flat, slot), on a reader thread
        self.threads = max(1, threads)          # reads in flight at most (guesses included)
        self._heap: list[list] = []             # [priority, order, flat, slot, live]
        self._queued: dict[int, list] = {}      # slot -> its live entry, until a reader starts it
        self._order = itertools.count()
        self._lock = threading.Lock()
        self._any = threading.Condition(self._lock)       # the readers of any read wait here,
        self._demand = threading.Condition(self._lock)    # the reserved reader (demand reads only) here
        self._stop = False
        self.guesses = 0                        # live guesses queued (callers skip the look when 0)
        self._demands = 0                       # demand reads queued or being read
        self._reading_guesses = 0               # guess reads being read
        # `reserve`: one more reader that takes demand reads only, so a layer call's own reads
        # start at once even while `threads` guesses are being read (a read cannot be stopped
        # once started: on spread routing the misses waited for wrong guesses to finish)
        roles = [(f"freetoken-disk_{i}", False) for i in range(self.threads)] + \
            ([("freetoken-disk_demand", True)] if reserve else [])
        # a reader holds the queue (and the cache its `read` belongs to) only while it takes or
        # runs a read: a queue dropped without `shutdown` is collected and its readers stop
        me = weakref.ref(self)
        self._readers = [threading.Thread(target=_serve, args=(me, only), name=name, daemon=True)
                         for name, only in roles]
        for t in self._readers:
            t.start()
        weakref.finalize(self, _wake_all, self._any, self._demand)

    def put(self, flat: int, slot: int, priority: int) -> None:
        self.put_many(((flat, slot, priority),))

    def put_many(self, reads) -> None:
        """Queue (flat, slot, priority) reads at once: one lock, one wake-up a read."""
        with self._lock:
            n = demand = 0
            for flat, slot, priority in reads:
                self._push(flat, slot, priority)
                n += 1
                demand += priority == DEMAND
            self._any.notify(n)
            if demand:
                self._demand.notify()

    def _push(self, flat: int, slot: int, priority: int) -> None:
        e = [priority, next(self._order), flat, slot, True]
        self._queued[slot] = e
        self.guesses += priority == GUESS
        self._demands += priority == DEMAND
        heapq.heappush(self._heap, e)

    def _take(self, slot: int) -> list | None:
        """The live queued entry of `slot`, taken out of the queue (under the lock); None if started."""
        e = self._queued.pop(slot, None)
        if e is not None:
            e[4] = False
            self.guesses -= e[0] == GUESS
            self._demands -= e[0] == DEMAND
        return e

    def promote(self, slot: int) -> None:
        """The queued guess of `slot` is needed now: it goes behind the demand reads queued, ahead of
        every guess. Nothing where it has started (or is a demand read already)."""
        with self._lock:
            e = self._queued.get(slot)
            if e is not None and e[0] != DEMAND:
                self._take(slot)
                self._push(e[2], slot, DEMAND)
                self._demand.notify()

    def cancel(self, slot: int) -> bool:
        """Drop the queued read of `slot` before it starts; False when it has started (it lands)."""
        with self._lock:
            return self._take(slot) is not None

    def queued_guesses(self) -> list[tuple[int, int]]:
        """(flat, slot) of every guess still queued."""
        with self._lock:
            return [(e[2], s) for s, e in self._queued.items() if e[0] == GUESS]

    def _pop(self, demand_only: bool = False) -> list | None:
        """The queued read that ranks first (`demand_only`: if a demand read), taken out of the
        queue (under the lock) and counted as being read; None: none, or a guess that must wait
        while demand reads are (`GUESSES_BESIDE_DEMAND`)."""
        while self._heap and not self._heap[0][4]:      # cancelled or promoted entries
            heapq.heappop(self._heap)
        if not self._heap or (demand_only and self._heap[0][0] != DEMAND):
            return None
        if self._heap[0][0] == GUESS and self._demands and GUESSES_BESIDE_DEMAND is not None \
                and self._reading_guesses >= GUESSES_BESIDE_DEMAND:
            return None
        e = heapq.heappop(self._heap)
        self._take(e[3])
        if e[0] == DEMAND:
            self._demands += 1              # (`_take` counted it off the queue: it is being read)
        else:
            self._reading_guesses += 1
        return e

    def finished(self, priority: int) -> None:
        """A read of `priority` is over (under the lock): the guesses held back wake when the
        last demand read is."""
        if priority == DEMAND:
            self._demands -= 1
            if not self._demands and self.guesses and GUESSES_BESIDE_DEMAND is not None:
                self._any.notify(self.threads)
        else:
            self._reading_guesses -= 1
        if self._stop and not self._queued:     # a reader held back at a shutdown may stop now
            self._any.notify_all()
            self._demand.notify_all()

    def condition(self, demand_only: bool) -> threading.Condition:
        """What a reader (`demand_only`: the reserved one) waits on for a read."""
        return self._demand if demand_only else self._any

    def take(self, demand_only: bool):
        """For a reader, under `condition`'s lock: (read, flat, slot) of the next read, taken out
        of the queue; None: none queued (wait); `_STOP`: shut down and nothing left to read."""
        e = self._pop(demand_only)
        if e is not None:
            return self._read, e[2], e[3], e[0]
        # (at a shutdown a guess held back is still queued: it runs first, the demand reader stops)
        return _STOP if self._stop and (demand_only or not self._queued) else None

    def shutdown(self) -> None:
        """Every queued read runs, then the readers stop."""
        with self._lock:
            self._stop = True
            self._any.notify_all()
            self._demand.notify_all()
        for t in self._readers:
            t.join()


def _wake_all(*conditions: threading.Condition) -> None:
    for c in conditions:
        with c:
            c.notify_all()


def _batch_policy() -> None:
    """This thread under SCHED_BATCH where the OS has it (`READERS_BATCH`); as it was otherwise."""
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_BATCH"):
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))      # (0: the calling thread)
        except OSError as e:
            log.debug("readers stay under the default policy: %s", e)


def _serve(ref: "weakref.ref[ReadQueue]", demand_only: bool) -> None:
    """A reader: takes the first-ranked read (`demand_only`: only a demand read) and runs it;
    waits between reads holding no reference to the queue; stops at `shutdown` once the queue
    is empty, or when the queue is gone."""
    if READERS_BATCH == "all" or (READERS_BATCH == "guesses" and not demand_only):
        _batch_policy()
    q = ref()
    if q is None:
        return
    wake = q.condition(demand_only)
    del q
    while True:
        with wake:
            while True:
                q = ref()
                if q is None:
                    return
                got = q.take(demand_only)
                del q
                if got is _STOP:
                    return
                if got is not None:
                    break
                wake.wait()
        read, flat, slot, priority = got
        del got
        try:
            read(flat, slot)
        except Exception:               # noqa: BLE001 -- a reader outlives one bad read
            log.exception("disk tier: reading expert %s into slot %s failed", flat, slot)
        del read
        with wake:
            q = ref()
            if q is None:
                return
            q.finished(priority)
            del q
