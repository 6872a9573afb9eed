"""Sigmoid routing with a selection bias and expert groups (DeepSeek-V3 "noaux_tc", GLM-4.5+).

Scores are sigmoid(router logits). A per-expert correction bias is added to the scores only
to choose experts (load balancing without an auxiliary loss), never to weight them. Experts
are split into `n_group` groups; a group's strength is the sum of its two best biased scores,
and only the `topk_group` strongest groups are eligible. The chosen experts' plain scores are
optionally renormalised to sum to one, then multiplied by `routed_scaling_factor`."""
from __future__ import annotations

import torch


class GroupedSigmoidRouting:
    def __init__(self, correction_bias: torch.Tensor | None, top_k: int, n_group: int = 1, topk_group: int = 1,
                 norm_topk_prob: bool = True, routed_scaling_factor: float = 1.0):
        self.bias = None if correction_bias is None else correction_bias.float()
        n = None if correction_bias is None else correction_bias.numel()
        if n is not None and n % n_group:
            raise ValueError(f"n_group={n_group} does not divide the {n} experts")
        self.top_k, self.n_group, self.topk_group = top_k, n_group, topk_group
        self.norm, self.scale = norm_topk_prob, float(routed_scaling_factor)

    def __call__(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Router logits [T, E] -> (expert ids [T, k], float32 weights [T, k])."""
        scores = logits.float().sigmoid()
        choice = scores if self.bias is None else scores + self.bias
        if self.n_group > 1 and self.topk_group < self.n_group:
            t, e = choice.shape
            grouped = choice.view(t, self.n_group, e // self.n_group)
            strength = grouped.topk(2, dim=-1).values.sum(dim=-1)                 # [T, groups]
            keep = torch.zeros_like(strength, dtype=torch.bool)
            keep.scatter_(1, strength.topk(self.topk_group, dim=-1).indices, True)
            choice = grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view(t, e)
        ids = choice.topk(self.top_k, dim=-1).indices
        w = scores.gather(1, ids)
        if self.norm:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return ids, w * self.scale
