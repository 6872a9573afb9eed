"""Ray Serve request routers for the engine deployment: prefix-aware (the default) and
round-robin (for comparison). They run in the process that holds the deployment handle
(the front end), which reads the same table through `registry.router_for(deployment)`."""
from __future__ import annotations

import itertools
import logging
import time
from collections import Counter

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from . import registry
from .forward import Forward
from .table import PrefixTable, Sessions, choose

log = logging.getLogger("freetoken.replicas")

TENTATIVE_S = 30.0     # a pick not routed by then no longer counts as load


def _forward(pending: PendingRequest | None) -> Forward | None:
    if pending is None:
        return None
    for a in pending.args or ():
        if isinstance(a, Forward):
            return a
    return None


class _FreeTokenRouter(RequestRouter):
    """What both policies share: the table of live replicas, requests in flight per
    replica (counted here, for the requests this process sends), targeted requests."""

    def initialize_state(self, queue_bound: int = 2, **_):
        self.queue_bound = queue_bound
        self.table = PrefixTable()
        self.sessions = Sessions()
        self.inflight: Counter = Counter()
        self.routed: Counter = Counter()          # reason -> requests
        # picked but not yet routed: Ray picks for several pending requests before it tells
        # us where any went, so each pick counts (and records its prompt and session) at once
        self.tentative: dict[int, tuple[str, float]] = {}   # id(pending request) -> (replica, when)
        registry.register(self._deployment_id.name, self)

    # --- replica set ----------------------------------------------------------------
    def update_replicas(self, replicas: list[RunningReplica]):
        super().update_replicas(replicas)
        live = {r.replica_id.unique_id for r in replicas}
        for r in live:
            self.table.add_replica(r)
        for r in set(self.table.replicas()) - live:
            self._forget(r, "left the deployment")

    def on_replica_actor_died(self, replica_id: ReplicaID):
        super().on_replica_actor_died(replica_id)
        self._forget(replica_id.unique_id, "died")

    def _forget(self, r: str, why: str) -> None:
        self.table.drop(r)
        n = self.sessions.drop_replica(r)
        self.inflight.pop(r, None)
        log.warning("replica %s %s: dropped from the routing table (%d sessions re-routed)", r, why, n)

    def live_replicas(self) -> list[str]:
        return sorted(r.unique_id for r in self._replica_id_set)

    # --- load -----------------------------------------------------------------------
    def on_request_routed(self, pending_request, replica_id: ReplicaID, result):
        self._untentative(id(pending_request))
        self.inflight[replica_id.unique_id] += 1
        fwd = _forward(pending_request)
        if fwd is not None and fwd.target is None:
            self.record(fwd, replica_id.unique_id)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str):
        r = replica_id.unique_id
        if self.inflight.get(r, 0) > 0:
            self.inflight[r] -= 1

    def record(self, fwd: Forward, r: str) -> None:
        """The request went to r: r will hold its prompt, and its session sticks there."""

    def _untentative(self, key: int) -> None:
        r = self.tentative.pop(key, (None, 0))[0]
        if r is not None and self.inflight.get(r, 0) > 0:
            self.inflight[r] -= 1

    def _tentative(self, pending, fwd: Forward | None, r: str) -> None:
        now = time.monotonic()
        for k in [k for k, (_, t) in self.tentative.items() if now - t > TENTATIVE_S]:
            self._untentative(k)                 # a pick Ray never routed (cancelled)
        self._untentative(id(pending))           # Ray asks again for one it could not place
        self.tentative[id(pending)] = (r, now)
        self.inflight[r] += 1
        if fwd is not None:
            self.record(fwd, r)

    # --- choice ---------------------------------------------------------------------
    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None):
        fwd = _forward(pending_request)
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        if fwd is not None and fwd.target is not None:
            return [[by_id[fwd.target]]] if fwd.target in by_id else []
        if fwd is not None and fwd.avoid in by_id and len(by_id) > 1:
            del by_id[fwd.avoid]
        if not by_id:
            return []
        first = self.pick(fwd, by_id)
        if pending_request is not None:
            self._tentative(pending_request, fwd, first)
        rest = sorted((r for r in by_id if r != first), key=lambda r: (self.inflight[r], r))
        return [[by_id[first]], [by_id[r] for r in rest]] if rest else [[by_id[first]]]

    def pick(self, fwd: Forward | None, by_id: dict) -> str:
        raise NotImplementedError


class PrefixAwareRouter(_FreeTokenRouter):
    """Sessions stick, else the longest cached prefix, else the least loaded, and the least
    loaded past a queue bound (the rule is `table.choose`)."""

    def pick(self, fwd, by_id):
        loads = {r: self.inflight[r] for r in by_id}
        key = fwd.key if fwd is not None and fwd.key else []
        session = fwd.session if fwd is not None else None
        c = choose(self.table.matches(key, list(by_id)), loads, self.sessions.get(session),
                   self.queue_bound, self.table.sizes())
        self.routed[c.reason] += 1
        return c.replica

    def record(self, fwd, r):
        if fwd.key:
            self.table.insert(r, fwd.key)
        self.sessions.set(fwd.session, r)


class RoundRobinRouter(_FreeTokenRouter):
    """Each request to the next replica in turn, whatever it holds (the baseline)."""

    def initialize_state(self, **kw):
        super().initialize_state(**kw)
        self._turn = itertools.count()

    def pick(self, fwd, by_id):
        self.routed["round-robin"] += 1
        ids = sorted(by_id)
        return ids[next(self._turn) % len(ids)]


ROUTERS = {"prefix": PrefixAwareRouter, "round-robin": RoundRobinRouter}
