"""ARC (Megiddo & Modha, FAST 2003) bookkeeping for the `SlotTable`: which resident ids were
seen once (T1) or at least twice (T2) recently, the ghost lists of their recent evictions
(B1, B2) and the adaptive target size `p` of T1. The table keeps the slots; this keeps the
lists and answers the paper's REPLACE question (evict from T1 or from T2?).

The paper's one access is split into the table's three steps, so that a batch of misses
(one layer of one step) can be planned at once:
  seen(ids)          hits move to T2's MRU end; ghost hits adapt `p`      (the access)
  order(k, incoming) the next k victims by REPLACE, LRU end first          (the choice)
  filled(x, victim)  the victim goes to its ghost list, x to T1 (or T2 if a ghost); the
                     paper's ghost-list trimming of a complete miss       (the fill)
For one key at a time this is the paper's algorithm exactly (tests/sim compares it with a
transcription in plain lists).

With admission control ("arc+admit") a complete miss -- in no list -- is not filled when the
cache is full: it runs on the CPU and is remembered in B1 (`declined`), so a second access
soon after is a ghost hit and is admitted (ARC with bypass: one-off experts never evict).
"""
from __future__ import annotations

from collections import OrderedDict


class ArcLists:
    def __init__(self, capacity: int):
        self.reset(capacity)

    def reset(self, capacity: int) -> None:
        self.c = int(capacity)
        self.p = 0.0
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()

    def ghost(self, x: int) -> bool:
        return x in self.b1 or x in self.b2

    def seen(self, ids) -> None:
        c = self.c
        for x in map(int, ids):
            if x in self.t1:
                del self.t1[x]
                self.t2[x] = None
            elif x in self.t2:
                self.t2.move_to_end(x)
            elif x in self.b1:
                self.p = min(float(c), self.p + max(len(self.b2) / len(self.b1), 1.0))
            elif x in self.b2:
                self.p = max(0.0, self.p - max(len(self.b1) / len(self.b2), 1.0))

    def order(self, evictable: set[int], k: int, incoming=()) -> list[int]:
        """Up to k evictable resident ids in REPLACE order (incoming[i]: the key whose fill
        the i-th victim makes room for, if known; it decides the paper's B2 tie)."""
        t1 = [x for x in self.t1 if x in evictable]
        t2 = [x for x in self.t2 if x in evictable]
        n1, out, i1, i2 = len(self.t1), [], 0, 0
        while len(out) < k and (i1 < len(t1) or i2 < len(t2)):
            x = int(incoming[len(out)]) if len(out) < len(incoming) else -1
            from_t1 = i1 < len(t1) and (n1 > self.p or (x in self.b2 and n1 == self.p) or i2 >= len(t2))
            if from_t1:
                out.append(t1[i1])
                i1, n1 = i1 + 1, n1 - 1
            else:
                out.append(t2[i2])
                i2 += 1
        return out

    def filled(self, x: int, victim: int) -> None:
        """x now resident, in the slot `victim` (-1: an empty slot) held."""
        c = self.c
        drop = False
        if x in self.b1 or x in self.b2:
            (self.b1 if x in self.b1 else self.b2).pop(x)
            dest = self.t2
        else:
            l1 = len(self.t1) + len(self.b1)
            total = l1 + len(self.t2) + len(self.b2)
            if l1 >= c:
                if len(self.t1) < c and self.b1:
                    self.b1.popitem(last=False)
                else:
                    drop = True          # T1 is the whole cache: its LRU leaves without a ghost
            elif total >= 2 * c and self.b2:
                self.b2.popitem(last=False)
            dest = self.t1
        if victim >= 0:
            if victim in self.t1:
                del self.t1[victim]
                if not drop:
                    self.b1[victim] = None
            else:
                self.t2.pop(victim, None)
                if not drop:
                    self.b2[victim] = None
        dest[x] = None

    def declined(self, x: int) -> None:
        """A complete miss left out of the cache (admission control): remembered in B1."""
        if self.ghost(x):
            return
        self.b1[x] = None
        while len(self.t1) + len(self.b1) > self.c and self.b1:
            self.b1.popitem(last=False)
        while len(self.t1) + len(self.t2) + len(self.b1) + len(self.b2) > 2 * self.c and self.b2:
            self.b2.popitem(last=False)

    def keep(self, ids: set[int], capacity: int) -> None:
        """After a resize to `capacity`: only `ids` stay resident (their lists kept); ghosts
        cleared."""
        self.c = int(capacity)
        self.t1 = OrderedDict((x, None) for x in self.t1 if x in ids)
        self.t2 = OrderedDict((x, None) for x in self.t2 if x in ids)
        self.b1.clear()
        self.b2.clear()
        self.p = min(self.p, float(self.c))

    def check(self, resident: set[int]) -> None:
        t1, t2, b1, b2 = (set(d) for d in (self.t1, self.t2, self.b1, self.b2))
        assert t1 | t2 == resident, "ARC lists != resident ids"
        assert not (t1 & t2) and not ((t1 | t2) & (b1 | b2)) and not (b1 & b2), "ARC lists overlap"
        assert len(t1) + len(t2) <= self.c and 0.0 <= self.p <= max(self.c, 0)
        assert len(t1) + len(b1) <= self.c and len(t1) + len(t2) + len(b1) + len(b2) <= 2 * self.c
