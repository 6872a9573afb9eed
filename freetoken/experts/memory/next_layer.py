"""Cross-layer prefetch: guess layer l+1's experts from layer l's routing of the same token.

The experts a token routes at consecutive layers are correlated (the residual stream
changes little between layers). The predictor learns, online and from decode only, how
often expert `b` of layer l+1 followed expert `a` of layer l in the same layer call:

  pairs[l, a, b]   calls that routed a at l and b at l+1
  seen[l, a]       calls that routed a at l and were followed by layer l+1

The prompt teaches it too (`observe_tokens`: token by token, row i of layer l with row i
of layer l+1), so the first decode tokens already have guesses. It predicts
P(b | routed set A at l) as the mean over a in A of pairs[l, a, b] / seen[l, a].
Experts of l+1 with that estimate >= `threshold` are the guess, likeliest first. A layer
call of several tokens (batched decode) counts as one set: their union.

With `hops` = H > 1 (the device cache's "+path"), the guess also reads the token's path: the
estimate is the mean over h = 1..H of P(b at l+1 | the experts the token routed at l+1-h), each
the same mean of pairwise rates from its own table (`far[h-2]`: a at layer m, b at m+h, counted
as `pairs`, prompt rows included). One layer's routing (top-2 of 128 on gpt-oss) is a thin
signal; the layers before it, read together, guess the next layer's misses better (docs/
benchmarks.md "Path prefetch"). Hops the token has not run yet (its first layers) are left out
of the mean.

With `wrap` (the disk tier), the layers are a cycle: the last layer's call is paired with the
next step's layer 0 (pairs[L-1]), so the last layer guesses the next token's first experts, to be
read while the output head, the sampling and layer 0's attention run.

Cost: H * L * E * E float32 counters (qwen3 48 x 128 x 128: 3 MiB a hop), O(H * |A| * E) per
layer call.
"""
from __future__ import annotations

import numpy as np

from ...kernels import cpu_kernels

THRESHOLD = 0.3     # measured: bench/prefetch_sweep.py, docs/routing-locality.md
# measured (bench/policy_bounds.py, docs/benchmarks.md "Path prefetch"): 2, 3, 4, 6, 8 hops on
# gpt-oss-120b (the cell 1 hop missed) -> 4 the fewest hops meeting every cell of issue 39's target
PATH_HOPS = 4


class NextLayerPredictor:
    def __init__(self, num_layers: int, num_experts: int, threshold: float = THRESHOLD, wrap: bool = False,
                 hops: int = 1):
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"prefetch threshold must be in (0, 1], got {threshold}")
        if not 1 <= hops <= max(1, num_layers):
            raise ValueError(f"prefetch path hops must be in 1..{max(1, num_layers)} (the layers), got {hops}")
        self.L, self.E, self.threshold, self.wrap, self.hops = num_layers, num_experts, threshold, wrap, hops
        self.pairs = np.zeros((num_layers, num_experts, num_experts), np.float32)
        self.seen = np.zeros((num_layers, num_experts), np.float32)
        self.far = np.zeros((hops - 1, num_layers, num_experts, num_experts), np.float32)  # far[h-2][m, a, b]
        self.far_seen = np.zeros((hops - 1, num_layers, num_experts), np.float32)
        self._path: list[tuple[int, np.ndarray]] = []       # decode: the token's last calls, consecutive layers
        self._tok_path: list[tuple[int, np.ndarray]] = []   # prefill: the same, rows per token
        self._layer, self._prev = -2, np.empty(0, np.int64)
        self._tok_layer, self._tok_prev = -2, np.empty((0, 0), np.int64)
        # one hop: a decode call's count update and guess in C (kernels/c/next_layer.c, the same
        # numbers; ~2 C calls for ~15 numpy ops, issue 39's decode thread), None: numpy
        self.lib = cpu_kernels() if hops == 1 else None
        self._p = np.empty(num_experts, np.float64)       # the C guess's estimate (scratch)
        # the tables' addresses, a layer's at a fixed stride (`.ctypes.data` costs ~1-2 us a use)
        self._at = (self.pairs.ctypes.data, self.seen.ctypes.data, self._p.ctypes.data)

    def _follows(self, layer: int, last: int) -> bool:
        return layer == last + 1 or (self.wrap and layer == 0 and last == self.L - 1)

    def observe_tokens(self, layer: int, rows: np.ndarray) -> None:
        """A prefill layer call: row i = the experts token i routed (ids within the layer).
        Paired row by row with the previous call when that was layer-1 with as many rows."""
        rows = np.asarray(rows, np.int64)
        prev = self._tok_prev
        if layer == self._tok_layer + 1 and prev.shape[0] == rows.shape[0] and rows.size and prev.size:
            E = self.E          # bincount: one pass over T*k*k pairs (np.add.at is ~10x slower)
            idx = (prev[:, :, None] * E + rows[:, None, :]).ravel()
            self.pairs[layer - 1] += np.bincount(idx, minlength=E * E).reshape(E, E)
            self.seen[layer - 1] += np.bincount(prev.ravel(), minlength=E)
        self._tok_layer, self._tok_prev = layer, rows
        if self.hops > 1:
            self._extend(self._tok_path, layer, rows, lambda h, m, prev: self._count_rows(h, m, prev, rows))

    def _count_rows(self, h: int, m: int, prev: np.ndarray, rows: np.ndarray) -> None:
        if len(prev) != len(rows) or not (prev.size and rows.size):
            return
        E = self.E
        idx = (prev[:, :, None] * E + rows[:, None, :]).ravel()
        self.far[h - 2, m] += np.bincount(idx, minlength=E * E).reshape(E, E)
        self.far_seen[h - 2, m] += np.bincount(prev.ravel(), minlength=E)

    def _extend(self, path: list, layer: int, ids: np.ndarray, count) -> None:
        """Append a call to the token's path (restarted unless it follows the last one), counting
        it against each earlier layer of the path `h` >= 2 hops back: count(h, layer_m, ids_m)."""
        if not path or not self._follows(layer, path[-1][0]):
            path.clear()
        for h in range(2, min(self.hops, len(path)) + 1):
            m, prev = path[-h]
            count(h, m, prev)
        path.append((layer, ids))
        del path[:-self.hops]

    def observe(self, layer: int, experts: np.ndarray) -> None:
        """One layer call's unique routed experts (ids within the layer), in execution order."""
        experts = np.ascontiguousarray(experts, np.int64)
        if self._follows(layer, self._layer) and len(self._prev) and len(experts):
            prev = self._prev
            if self.lib is not None:
                m = (layer - 1) % self.L                                # layer 0: pairs[-1], the wrap
                pairs, seen, _ = self._at
                if self.lib.ft_next_layer_observe(pairs + m * self.E * self.E * 4, seen + m * self.E * 4,
                                                  prev.ctypes.data, len(prev), experts.ctypes.data, len(experts),
                                                  self.E) < 0:
                    raise IndexError(f"expert ids {experts.tolist()} after {prev.tolist()}: outside 0..{self.E - 1}")
            else:
                self.pairs[layer - 1][np.ix_(prev, experts)] += 1.0        # layer 0: pairs[-1], the wrap
                self.seen[layer - 1][prev] += 1.0
        self._layer, self._prev = layer, experts
        if self.hops > 1:
            self._extend(self._path, layer, self._prev, self._count_set)

    def _count_set(self, h: int, m: int, prev: np.ndarray) -> None:
        experts = self._prev
        if len(prev) and len(experts):
            self.far[h - 2, m][np.ix_(prev, experts)] += 1.0
            self.far_seen[h - 2, m][prev] += 1.0

    def probabilities(self, layer: int, experts: np.ndarray) -> np.ndarray:
        """The estimate P(b at layer+1 | experts at layer) for every b (zeros when unknown; with
        `wrap`, the last layer's is the next step's layer 0)."""
        if (layer + 1 >= self.L and not self.wrap) or len(experts) == 0:
            return np.zeros(self.E)
        p, n = _rate(self.pairs[layer], self.seen[layer], experts), 1
        path = self._path       # the earlier hops, when the last call observed is this one
        if len(path) > 1 and path[-1][0] == layer and np.array_equal(path[-1][1], experts):
            for h in range(2, len(path) + 1):
                m, prev = path[-h]
                if len(prev):
                    p, n = p + _rate(self.far[h - 2, m], self.far_seen[h - 2, m], prev), n + 1
        return p / n

    def predict(self, layer: int, experts: np.ndarray) -> np.ndarray:
        """Experts of layer+1 (ids within the layer) with estimate >= threshold, likeliest
        first, ties to the lower id."""
        if self.lib is not None and (layer + 1 < self.L or self.wrap):
            ids = np.ascontiguousarray(experts, np.int64)
            out = np.empty(self.E, np.int64)
            pairs, seen, p = self._at
            n = self.lib.ft_next_layer_predict(pairs + layer * self.E * self.E * 4, seen + layer * self.E * 4,
                                               ids.ctypes.data, len(ids), self.E, self.threshold - 1e-9, p,
                                               out.ctypes.data)
            if n < 0:
                raise IndexError(f"expert ids {ids.tolist()}: outside 0..{self.E - 1}")
            return out[:n]
        p = self.probabilities(layer, experts)
        guess = np.flatnonzero(p >= self.threshold - 1e-9)
        return guess[np.lexsort((guess, -p[guess]))]


def _rate(pairs: np.ndarray, seen: np.ndarray, experts: np.ndarray) -> np.ndarray:
    """mean over a in experts of pairs[a, b] / seen[a], for every b (0 where a was never seen)."""
    rows = pairs[experts].astype(np.float64) / np.maximum(seen[experts], 1.0)[:, None]
    return rows.sum(0) / len(experts)
