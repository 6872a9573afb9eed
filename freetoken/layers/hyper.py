"""Manifold-constrained hyper-connections (mHC, DeepSeek-V4): the residual is `hc_mult`
parallel streams per token. Before a block, learned weights collapse the streams into the
block's input (`pre`); after it, the output is spread back (`post`) and added to the streams
mixed by `comb`, a matrix pushed towards doubly stochastic by Sinkhorn-Knopp iterations.
All in float32, as the reference keeps these modules."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..platform import gemm_aligned


def unweighted_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)


class HyperConnection:
    def __init__(self, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, hc: int, iters: int,
                 hc_eps: float, norm_eps: float):
        self.fn, self.base, self.scale = gemm_aligned(fn.float()), base.float(), scale.float()   # [(2+hc)hc, hc*D], [(2+hc)hc], [3]
        self.hc, self.iters, self.hc_eps, self.norm_eps = hc, iters, hc_eps, norm_eps

    def __call__(self, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """streams [N, hc, D] -> (post [N, hc], comb [N, hc, hc], collapsed block input [N, D])."""
        hc, eps = self.hc, self.hc_eps
        mixes = F.linear(unweighted_rms_norm(streams.flatten(1).float(), self.norm_eps), self.fn)
        pre_w, post_w, comb_w = mixes.split([hc, hc, hc * hc], dim=-1)
        pre_b, post_b, comb_b = self.base.split([hc, hc, hc * hc])
        pre = torch.sigmoid(pre_w * self.scale[0] + pre_b) + eps
        post = 2 * torch.sigmoid(post_w * self.scale[1] + post_b)
        comb = torch.softmax(comb_w.view(-1, hc, hc) * self.scale[2] + comb_b.view(hc, hc), dim=-1) + eps
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
        for _ in range(self.iters - 1):
            comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
            comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
        collapsed = (pre.unsqueeze(-1) * streams).sum(dim=1).to(streams.dtype)
        return post, comb, collapsed

    @staticmethod
    def expand(post: torch.Tensor, comb: torch.Tensor, out: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
        """New streams: the block output spread by `post` plus the streams mixed by `comb`."""
        dt = streams.dtype
        return post.to(dt).unsqueeze(-1) * out.unsqueeze(-2) + torch.matmul(comb.to(dt).transpose(-1, -2), streams)


class HyperHead:
    """The final collapse of the streams into one hidden state (before the last RMSNorm)."""

    def __init__(self, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, hc_eps: float, norm_eps: float):
        self.fn, self.base, self.scale, self.hc_eps, self.norm_eps = gemm_aligned(fn.float()), base.float(), scale.float(), hc_eps, norm_eps

    def __call__(self, streams: torch.Tensor) -> torch.Tensor:
        mixes = F.linear(unweighted_rms_norm(streams.flatten(1).float(), self.norm_eps), self.fn)
        pre = torch.sigmoid(mixes * self.scale + self.base) + self.hc_eps
        return (pre.unsqueeze(-1) * streams).sum(dim=1).to(streams.dtype)
