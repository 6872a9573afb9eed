"""Router lookahead: guess layer l+1's experts by applying layer l+1's router to layer l's
hidden state (the MoE input of layer l), so their reads start while layer l computes.

The residual stream changes little from one layer to the next, so the next router's top-k
on this layer's input is a good guess of what it will route (antirez/ds4: +34-44% decode on a
36 GB Mac). It costs one router GEMV (E x hidden) per layer call, nothing is ever computed
with a guess: the guess only decides which experts are read ahead, so the tokens are the
same whatever it guesses. The history predictor (experts/memory/next_layer.py) is the
fallback where the model has no plain router to borrow (hash-routed layers) or lookahead is
"history".

`GuessScore` keeps, for whichever guess is used, how good the guesses were: guessed experts,
those of them the next layer really routed (precision) and the share of the next layer's
experts that were guessed (recall)."""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ...kernels.pool import CpuPool

LOOKAHEAD_CHOICES = ("auto", "router", "history", "off")
# layers read ahead of the one running: layer l+1's guess (router or history), then the history
# predictor chained from it for l+2, ... (the layers a cycle: the last layer guesses the next
# token's first). Two: a read started after layer l has layer l+1's attention and MoE call and
# layer l+2's attention to land in (the 4-layer 30B-A3B-shaped bench at a 5% host cache waited
# on reads for ~half its disk time with one layer ahead; docs/benchmarks.md "Disk tier: reading
# further ahead").
DEPTH = 1


def model_routes(model) -> dict[int, Callable]:
    """{moe layer index: route(x) -> (ids, weights)} of every MoE layer of `model` whose router
    needs only the hidden state (layers/moe.py's SparseMoE and its DeepSeek variant, found by
    their `moe_layer` and `route`; not hash-routed layers, whose `routes_for` needs the token ids)."""
    routes = {}
    for layer in getattr(model, "layers", None) or []:
        for part in vars(layer).values():
            if isinstance(getattr(part, "moe_layer", None), int) and callable(getattr(part, "route", None)) \
                    and not hasattr(part, "routes_for"):
                routes[part.moe_layer] = part.route
    return routes


class RouterLookahead:
    """Layer l+1's router applied to layer l's MoE input. A one-token guess on a router with the
    C kernels' GEMV (layers/moe.py `top_ids_on`) runs on the decode thread alone, into buffers
    kept per layer: the shared pool's GEMV cost the decode thread ~95 us of CPU a call (~145 us
    all threads, waiting on a worker), this ~30 us (stop 48, docs/benchmarks.md)."""

    def __init__(self, routes: dict[int, Callable]):
        self.routes = routes
        self._alone = None          # the one-thread pool of the one-token guesses (made on first use)
        self._scratch: dict[tuple, tuple] = {}  # (layer+1, rows) -> (router, x, logits, ids, w, ids as numpy)
        self._last: tuple | None = None     # the last one-token guess: (layer+1, its logits, its top-k)

    def guess(self, layer: int, x: torch.Tensor) -> np.ndarray | None:
        """Expert ids (within layer+1) its router picks for `x`, best rank first (every
        token's first choice, then every token's second, ...); None: no router for layer+1."""
        route = self.routes.get(layer + 1)
        if route is None:
            return None
        self._last = None
        if x.device.type == "cpu" and x.dtype == torch.float32:
            ids = self._alone_rows(layer + 1, route, x)
            if ids is not None:
                return ids[0].copy() if len(ids) == 1 else _rank_major(ids)     # (the buffer is the next guess's)
        with torch.no_grad():
            ids, _ = route(x)
        return _rank_major(ids.to("cpu", torch.int64).numpy())

    def _alone_rows(self, nxt: int, route: Callable, x: torch.Tensor) -> np.ndarray | None:
        """The guess's top-k ids [M, k] on the decode thread alone (None: this router has no such
        path). A verify's rows too: on the shared pool their GEMV waited on its worker, and the
        verify steps of a 48-layer disk-tier decode spent ~10% of the tier's Python there (py-spy)."""
        M = x.shape[0]
        sc = self._scratch.get((nxt, M))
        if sc is None:
            sc = self._scratch[(nxt, M)] = self._buffers(route, x.shape[1], M)
        moe, xs, logits, ids, w, out = sc
        if moe is None:
            return None
        moe.top_ids_on(self._alone, x if x.is_contiguous() else xs.copy_(x), logits, ids, w)
        if M == 1:
            self._last = (nxt, logits, out)
        return out

    def runners_up(self, layer: int, n: int) -> np.ndarray:
        """The n experts of layer+1 its router ranks next after its top-k in the last one-token
        guess for layer+1, best first (empty: that guess had several rows or no logits here).
        Read after the top-k, they cover some of the next layer's misses the top-k does not."""
        last = self._last
        if n <= 0 or last is None or last[0] != layer + 1:
            return np.empty(0, np.int64)
        scores, top = last[1].numpy()[0], last[2][0]
        n = min(n, len(scores) - len(top))
        if n <= 0:
            return np.empty(0, np.int64)
        near = np.argpartition(-scores, len(top) + n - 1)[:len(top) + n]   # (the ranks are the softmax's)
        near = near[np.argsort(-scores[near], kind="stable")]
        return near[~np.isin(near, top)][:n]

    def _buffers(self, route: Callable, hidden: int, rows: int = 1) -> tuple:
        moe = getattr(route, "__self__", None)
        if moe is None or not callable(getattr(moe, "kernel_top_ids", None)) or not moe.kernel_top_ids(rows):
            return (None,) * 6
        if self._alone is None:
            self._alone = CpuPool(moe.router.pool.lib, 1, pin=False)
        ids = torch.empty(rows, moe.top_k, dtype=torch.int64)
        return (moe, torch.empty(rows, hidden), torch.empty(rows, moe.router.out_features), ids,
                torch.empty(rows, moe.top_k), ids.numpy())

    def chunk(self, layer: int, x: torch.Tensor) -> np.ndarray | None:
        """The experts (within layer+1, ascending) its router picks for any token of a prompt
        chunk `x`: what the chunk's reads of layer+1 are (backend.PREFILL_READ); None: no router."""
        route = self.routes.get(layer + 1)
        if route is None:
            return None
        with torch.no_grad():
            ids, _ = route(x)
        return np.unique(ids.to("cpu", torch.int64).numpy())


def _rank_major(ids: np.ndarray) -> np.ndarray:
    """Rows' top-k ids [M, k] as one guess: every row's first choice, then every second, ..., each once."""
    if ids.shape[0] == 1:
        return ids[0]               # one token: its top-k, distinct and best first
    order = ids.T.ravel()
    _, first = np.unique(order, return_index=True)
    return order[np.sort(first)]


def chain(predictor, layer: int, guess: np.ndarray, depth: int) -> list[tuple[int, np.ndarray]]:
    """[(layer+d, its guessed ids), d = 2..depth]: the history predictor applied to its own guess
    for the layer before, modulo the layer count (the next token's layers after the last); stops
    at the first empty guess and before coming back to `layer` itself."""
    out, L = [], predictor.L
    for d in range(2, depth + 1):
        if d >= L or not len(guess):
            break
        guess = predictor.predict((layer + d - 1) % L, guess)
        if len(guess):
            out.append(((layer + d) % L, guess))
    return out


class GuessScore:
    """How good the next-layer guesses were: counted when layer l+1 runs after a guess at l."""

    def __init__(self):
        self.guessed = self.right = self.needed = 0
        self._pending: tuple[int, np.ndarray] | None = None

    def guessed_for(self, layer: int, flats: np.ndarray) -> None:
        self._pending = (layer, np.asarray(flats, np.int64))

    def routed(self, layer: int, uniq_flats: np.ndarray, listed: list | None = None) -> None:
        """Scores the pending guess for `layer` against what it routed (`listed`: uniq_flats as a
        list, where the caller has it)."""
        if self._pending is not None and self._pending[0] == layer:
            g = self._pending[1]
            self.guessed += len(g)
            # a decode call's few ids: a set intersection (~1 us; np.isin costs ~10x that)
            self.right += len(set(g.tolist()).intersection(uniq_flats.tolist() if listed is None else listed))
            self.needed += len(uniq_flats)
        self._pending = None

    @property
    def waiting(self) -> bool:
        """A guess waits to be scored against the next layer call."""
        return self._pending is not None

    def f1(self) -> float:
        """2 x right / (guessed + needed): precision and recall in one number (0 before any)."""
        return 2 * self.right / (self.guessed + self.needed) if self.guessed + self.needed else 0.0

    def stats(self, source: str) -> dict:
        return {"source": source, "guessed": self.guessed, "right": self.right, "needed": self.needed,
                "precision": self.right / self.guessed if self.guessed else 0.0,
                "recall": self.right / self.needed if self.needed else 0.0}
