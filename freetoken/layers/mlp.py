"""Dense SwiGLU MLP (dense layers and shared experts), gate and up fused into one matmul."""
import torch
import torch.nn.functional as F

from .linear import Linear


class GatedMLP:
    def __init__(self, gate_up: Linear, down: Linear):
        self.gate_up, self.down = gate_up, down     # [2I, H], [H, I]
        self.inter = down.in_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gu = self.gate_up(x)
        return self.down(F.silu(gu[..., : self.inter]) * gu[..., self.inter:])
