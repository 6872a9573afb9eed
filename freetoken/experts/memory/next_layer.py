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

With `wrap` (the disk tier), the layers are a cycle: the last layer's call is paired with the
next step's layer 0 (pairs[L-1]), so the last layer guesses the next token's first experts, to be
read while the output head, the sampling and layer 0's attention run.

Cost: L * E * E float32 counters (qwen3 48 x 128 x 128: 3 MiB), O(|A| * E) per layer call.
"""
from __future__ import annotations

import numpy as np

THRESHOLD = 0.3     # measured: bench/prefetch_sweep.py, docs/routing-locality.md


class NextLayerPredictor:
    def __init__(self, num_layers: int, num_experts: int, threshold: float = THRESHOLD, wrap: bool = False):
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"prefetch threshold must be in (0, 1], got {threshold}")
        self.L, self.E, self.threshold, self.wrap = num_layers, num_experts, threshold, wrap
        self.pairs = np.zeros((num_layers, num_experts, num_experts), np.float32)
        self.seen = np.zeros((num_layers, num_experts), np.float32)
        self._layer, self._prev = -2, np.empty(0, np.int64)
        self._tok_layer, self._tok_prev = -2, np.empty((0, 0), np.int64)

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

    def observe(self, layer: int, experts: np.ndarray) -> None:
        """One layer call's unique routed experts (ids within the layer), in execution order."""
        follows = layer == self._layer + 1 or (self.wrap and layer == 0 and self._layer == self.L - 1)
        if follows and len(self._prev) and len(experts):
            prev = self._prev
            self.pairs[layer - 1][np.ix_(prev, experts)] += 1.0        # layer 0: pairs[-1], the wrap
            self.seen[layer - 1][prev] += 1.0
        self._layer, self._prev = layer, np.asarray(experts, np.int64)

    def probabilities(self, layer: int, experts: np.ndarray) -> np.ndarray:
        """The estimate P(b at layer+1 | experts at layer) for every b (zeros when unknown; with
        `wrap`, the last layer's is the next step's layer 0)."""
        if (layer + 1 >= self.L and not self.wrap) or len(experts) == 0:
            return np.zeros(self.E)
        seen = self.seen[layer][experts]
        rows = self.pairs[layer][experts].astype(np.float64) / np.maximum(seen, 1.0)[:, None]
        return rows.sum(0) / len(experts)

    def predict(self, layer: int, experts: np.ndarray) -> np.ndarray:
        """Experts of layer+1 (ids within the layer) with estimate >= threshold, likeliest
        first, ties to the lower id."""
        p = self.probabilities(layer, experts)
        guess = np.flatnonzero(p >= self.threshold - 1e-9)
        return guess[np.lexsort((guess, -p[guess]))]
