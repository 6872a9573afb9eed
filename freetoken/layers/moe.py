"""The sparse MoE block: router -> top-k -> the experts seam (+ optional shared expert)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..experts.base import Experts
from .linear import Linear
from .mlp import GatedMLP


class SparseMoE:
    def __init__(self, moe_layer: int, router: Linear, experts: Experts, top_k: int,
                 norm_topk_prob: bool, shared: GatedMLP | None = None, shared_gate: torch.Tensor | None = None,
                 softmax_after_topk: bool = False, on_route=None, routing=None):
        # the router is a Linear too: on the CPU its GEMV runs in the kernels' pool, so no torch
        # op of a decode step starts OpenMP workers that would fight the pool for the cores
        self.moe_layer, self.router = moe_layer, router
        self.experts, self.top_k, self.norm = experts, top_k, norm_topk_prob
        self.shared, self.shared_gate = shared, shared_gate
        self.softmax_after_topk = softmax_after_topk   # gpt-oss: top-k on logits, softmax over the k
        self.on_route = on_route                       # routing-trace hook: (layer, ids, weights)
        self.routing = routing                         # e.g. GroupedSigmoidRouting: fp32 logits -> (ids, weights)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.routing is not None:              # sigmoid routers score in fp32, as the references do
            ids, w = self.routing(self.router(x.float()))
            return ids, w.to(x.dtype)
        logits = self.router(x)
        if self.softmax_after_topk:
            top, ids = torch.topk(logits, self.top_k, dim=-1)
            return ids, torch.softmax(top, dim=-1, dtype=torch.float32).to(x.dtype)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        w, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm:
            w = w / w.sum(dim=-1, keepdim=True)
        return ids, w.to(x.dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        ids, w = self.route(x)
        if self.on_route is not None:
            self.on_route(self.moe_layer, ids, w)
        out = self.experts.forward(self.moe_layer, x, ids, w)
        if self.shared is not None:
            s = self.shared(x)
            if self.shared_gate is not None:
                s = torch.sigmoid(F.linear(x, self.shared_gate)) * s
            out = out + s
        return out
