"""RMSNorm, computed in float32 like the reference implementations, then cast back."""
import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = F.rms_norm(x.float(), (x.shape[-1],), eps=eps)   # one fused kernel instead of five ops
    return weight * h.to(x.dtype)


class RMSNorm:
    def __init__(self, weight: torch.Tensor, eps: float):
        self.weight, self.eps = weight, eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)
