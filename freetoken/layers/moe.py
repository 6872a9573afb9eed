"""The sparse MoE block: router -> top-k -> the experts seam (+ optional shared expert)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..experts.base import Experts
from ..kernels import cpu_kernels
from ..platform import gemm_aligned
from .kernel_rows import GEMV_TOKENS
from .linear import Linear
from .mlp import GatedMLP


class SparseMoE:
    def __init__(self, moe_layer: int, router: Linear, experts: Experts, top_k: int,
                 norm_topk_prob: bool, shared: GatedMLP | None = None, shared_gate: torch.Tensor | None = None,
                 softmax_after_topk: bool = False, on_route=None):
        # the router is a Linear too: on the CPU its GEMV runs in the kernels' pool, so no torch
        # op of a decode step starts OpenMP workers that would fight the pool for the cores
        self.moe_layer, self.router = moe_layer, router
        self.experts, self.top_k, self.norm = experts, top_k, norm_topk_prob
        self.shared, self.shared_gate = shared, None if shared_gate is None else gemm_aligned(shared_gate)
        self.softmax_after_topk = softmax_after_topk   # gpt-oss: top-k on logits, softmax over the k
        self.on_route = on_route                       # routing-trace hook: (layer, ids, weights)
        # (layer, ids) -> ids: another model's recorded routing in place of the router's choice
        # (sim/trace_routing.py: a bench prices verifies on a real model's union of experts)
        self.forced_routes = None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._route_logits(x, self.router(x))

    def _route_logits(self, x: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lib = cpu_kernels() if logits.device.type == "cpu" and logits.dtype == torch.float32 else None
        if lib is not None and logits.shape[0] <= GEMV_TOKENS:   # decode/verify-sized: one C call, no torch dispatch
            logits = logits.contiguous()
            n, e = logits.shape
            ids = torch.empty(n, self.top_k, dtype=torch.int64)
            w = torch.empty(n, self.top_k, dtype=torch.float32)
            lib.ft_route_topk(logits.data_ptr(), n, e, self.top_k, int(self.norm), int(self.softmax_after_topk),
                              ids.data_ptr(), w.data_ptr())
            return ids, w.to(x.dtype)
        if self.softmax_after_topk:
            top, ids = torch.topk(logits, self.top_k, dim=-1)
            return ids, torch.softmax(top, dim=-1, dtype=torch.float32).to(x.dtype)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        w, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm:
            w = w / w.sum(dim=-1, keepdim=True)
        return ids, w.to(x.dtype)

    def kernel_top_ids(self, rows: int = 1) -> bool:
        """Whether `top_ids_on` picks what `route` picks for `rows` rows: this class's softmax
        top-k router (not a subclass's own rule) on the C kernels' GEMV, rows <= GEMV_TOKENS."""
        return rows <= GEMV_TOKENS and type(self).route is SparseMoE.route and getattr(self.router, "pool", None) is not None \
            and hasattr(self.router, "gemv_on") and cpu_kernels() is not None

    def top_ids_on(self, pool, x: torch.Tensor, logits: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> None:
        """`route`'s ids for the rows of `x` (contiguous fp32, M <= GEMV_TOKENS), best first, into
        `ids` (int64 [M, top_k]); `logits` (fp32 [M, E]) and `w` (fp32 [M, top_k]) the caller's
        scratch. The GEMV and the top-k run on `pool` alone (a caller's one-thread pool: the disk
        tier's router guess, with nothing allocated a call). Only where `kernel_top_ids()`."""
        self.router.gemv_on(pool, x, logits)
        n, e = logits.shape
        cpu_kernels().ft_route_topk(logits.data_ptr(), n, e, self.top_k, int(self.norm), int(self.softmax_after_topk),
                                    ids.data_ptr(), w.data_ptr())

    def __call__(self, x: torch.Tensor, logits: torch.Tensor | None = None,
                 residual: torch.Tensor | None = None) -> torch.Tensor:
        """logits: the router's GEMV of x where a caller ran it already (a decode row's one-call
        attention half, layers/attention/decode_half.py; the bits `self.router(x)` gives).
        residual: the layer's residual stream h; then h + the block's output (without a shared
        expert, summed in the experts' C call where the fused path runs: the bits of `h + out`)."""
        fold = residual is not None and self.shared is None
        out = self._fused(x, logits, residual if fold else None)
        if out is not None and fold:
            return out
        if out is None:
            out = self._experts_on(x, *(self.route(x) if logits is None else self._route_logits(x, logits)))
        if self.shared is not None:
            s = self.shared(x)
            if self.shared_gate is not None:
                s = row_gate(x, self.shared_gate) * s
            out = out + s
        return out if residual is None else residual + out

    def decode_row(self, x: torch.Tensor, logits: torch.Tensor, residual: torch.Tensor, fresh: bool):
        """This block's decode of one row as `self(x, logits, residual)` gives it, as a call on the
        caller's reused rows (`x`, `logits`, `residual`: a decode row's attention half, which
        ran the router's GEMV) with everything resolved now (experts/execution/decode_row.py's
        `MoERow`), or None where that path never applies (a shared expert, another routing
        rule, a backend without it). Per call the caller still checks `row_live`. `fresh`: the
        output outlives the step (a new row each call)."""
        if self.shared is not None or type(self).route is not SparseMoE.route or cpu_kernels() is None \
                or not hasattr(self.experts, "decode_row"):
            return None
        return self.experts.decode_row(self.moe_layer, self.top_k, self.norm, self.softmax_after_topk, x, logits,
                                       residual, fresh)

    def row_live(self, row) -> bool:
        """Whether `row` (from `decode_row`) takes this step: the fused calls on, no routing hook
        or forced routes, and the backend it was made by still seated."""
        return FUSED[0] and ROWS[0] and self.on_route is None and self.forced_routes is None \
            and getattr(self.experts, "backend", self.experts) is row.backend

    def _experts_on(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """The experts on routes picked by the router (or forced), the routing hook told first."""
        if self.forced_routes is not None:
            ids = self.forced_routes(self.moe_layer, ids)
        if self.on_route is not None:
            self.on_route(self.moe_layer, ids, w)
        return self.experts.forward(self.moe_layer, x, ids, w)

    def _fused(self, x: torch.Tensor, logits: torch.Tensor | None = None,
               residual: torch.Tensor | None = None) -> torch.Tensor | None:
        """A decode step's top-k and experts after the router GEMV in one C call, where the
        routing is this class's own rule, no routes are forced and the backend has the call
        (`CpuExperts.forward_logits`), plus `residual` where given; else None. A routing hook
        (observers: the speculative routing counters) gets fresh ids and weights after the call."""
        if (not FUSED[0] or self.forced_routes is not None or x.device.type != "cpu"
                or x.dtype != torch.float32       # (the five-call path rounds the weights to x's dtype)
                or x.shape[0] > GEMV_TOKENS or type(self).route is not SparseMoE.route
                or not hasattr(self.experts, "forward_logits") or cpu_kernels() is None):
            return None
        logits = self.router(x) if logits is None else logits
        routes = None if self.on_route is None else (torch.empty(x.shape[0], self.top_k, dtype=torch.int64),
                                                     torch.empty(x.shape[0], self.top_k, dtype=torch.float32))
        args = (self.moe_layer, x, logits, self.top_k, self.norm, self.softmax_after_topk, routes)
        out = self.experts.forward_logits(*args) if residual is None else self.experts.forward_logits(*args, residual)
        if out is None:       # (the router ran: route its logits the usual way, once)
            out = self._experts_on(x, *self._route_logits(x, logits))
            return out if residual is None else residual + out
        if self.on_route is not None:
            self.on_route(self.moe_layer, *routes)
        return out


# the fused decode call on (tests switch it off to compare with the five-call path)
FUSED = [True]
# a decode row's MoE call on the attention half's rows (`decode_row`) on (tests switch it off to
# compare with the same call made through `__call__`)
ROWS = [True]


def row_gate(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """sigmoid(x gate^T), a decode/verify step's few rows one at a time on the CPU: torch's GEMM
    and its vectorized sigmoid round by row count, and a row's bits must not depend on it."""
    if x.device.type != "cpu" or x.shape[0] > GEMV_TOKENS:
        return torch.sigmoid(F.linear(x, gate))
    return torch.cat([torch.sigmoid(F.linear(x[i:i + 1], gate)) for i in range(x.shape[0])])


def gate_scores(logits: torch.Tensor, score: str) -> torch.Tensor:
    """sigmoid or sqrt(softplus) of router logits [n, e], every element on torch's vectorized
    path (rows padded to 64 columns): its scalar tail rounds exp otherwise, and a row's scores
    then depended on how many rows shared the call (a verify's rows vs decode steps)."""
    pad = -logits.shape[-1] % 64
    x = F.pad(logits, (0, pad)) if pad else logits
    scores = torch.sigmoid(x) if score == "sigmoid" else torch.sqrt(F.softplus(x))
    return scores[:, :logits.shape[-1]] if pad else scores


def grouped_sigmoid_topk(logits: torch.Tensor, bias: torch.Tensor, top_k: int, n_group: int, topk_group: int,
                         norm: bool, scale: float, score: str = "sigmoid") -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 routing (fp32): scores = sigmoid(logits) (or sqrt(softplus) for V4); experts
    are chosen on scores + correction bias, only inside the `topk_group` groups whose two best
    biased scores sum highest; weights are the unbiased scores, optionally renormalised, times
    `routed_scaling_factor`. DeepSeek-V2 (score "softmax"): softmax scores, groups ranked by
    their best score ("group_limited_greedy"), no bias."""
    if score in ("sigmoid", "sqrtsoftplus"):
        scores = gate_scores(logits, score)
    elif score == "softmax":
        scores = torch.softmax(logits, dim=-1)
    else:
        raise ValueError(f"scoring_func {score!r} is not supported (expected sigmoid, sqrtsoftplus or softmax)")
    choice = scores + bias
    if n_group > 1 and topk_group < n_group:
        n, e = choice.shape
        best = choice.view(n, n_group, e // n_group).topk(1 if score == "softmax" else 2, dim=-1)[0]
        groups = best.sum(-1)
        keep = torch.zeros_like(groups, dtype=torch.bool).scatter_(1, groups.topk(topk_group, dim=-1)[1], True)
        choice = choice.masked_fill(~keep.repeat_interleave(e // n_group, dim=1), float("-inf"))
    ids = choice.topk(top_k, dim=-1)[1]
    w = scores.gather(1, ids)
    if norm:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return ids, w * scale


class BiasCorrectedMoE(SparseMoE):
    """SparseMoE with DeepSeek's router: fp32 router GEMV, `grouped_sigmoid_topk`, shared experts
    added unweighted."""

    def __init__(self, moe_layer, router, experts, top_k, norm_topk_prob, bias, n_group, topk_group, scale,
                 shared=None, score="sigmoid"):
        super().__init__(moe_layer, router, experts, top_k, norm_topk_prob, shared=shared)
        self.bias, self.n_group, self.topk_group, self.scale, self.score = bias.float(), n_group, topk_group, scale, score

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.router(x.float()).float()
        ids, w = grouped_sigmoid_topk(logits, self.bias, self.top_k, self.n_group, self.topk_group, self.norm,
                                      self.scale, self.score)
        return ids, w.to(x.dtype)


class HashRoutedMoE(BiasCorrectedMoE):
    """DeepSeek-V4's first layers: the experts of a token are a fixed table row `tid2eid[token]`,
    known before the layer runs; the learned gate only weights them (sqrt-softplus scores,
    renormalised, times `routed_scaling_factor`)."""

    def __init__(self, moe_layer, router, experts, top_k, tid2eid: torch.Tensor, scale, shared=None,
                 score="sqrtsoftplus"):
        super().__init__(moe_layer, router, experts, top_k, True, torch.zeros(1), 1, 1, scale, shared=shared,
                         score=score)
        self.tid2eid = tid2eid.long()

    def routes_for(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.tid2eid.index_select(0, input_ids)

    def route_ids(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        logits = self.router(x.float()).float()
        w = gate_scores(logits, self.score).gather(1, ids)
        return (w / (w.sum(dim=-1, keepdim=True) + 1e-20) * self.scale).to(x.dtype)

    def __call__(self, x: torch.Tensor, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        if input_ids is None:
            raise ValueError("hash-routed MoE needs the step's token ids")
        ids = self.routes_for(input_ids)
        w = self.route_ids(x, ids)
        if self.on_route is not None:
            self.on_route(self.moe_layer, ids, w)
        out = self.experts.forward(self.moe_layer, x, ids, w)
        return out + self.shared(x) if self.shared is not None else out
