"""Dense SwiGLU MLP (dense layers and shared experts), gate and up fused into one matmul."""
import torch
import torch.nn.functional as F


class GatedMLP:
    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor):
        self.gate_up, self.down = gate_up, down     # [2I, H], [H, I]
        self.inter = down.shape[1]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gu = F.linear(x, self.gate_up)
        return F.linear(F.silu(gu[..., : self.inter]) * gu[..., self.inter:], self.down)
