"""Dense SwiGLU MLP (dense layers and shared experts), gate and up fused into one matmul."""
import torch
import torch.nn.functional as F

from .linear import Linear


class GatedMLP:
    def __init__(self, gate_up: Linear, down: Linear, limit: float | None = None, act=F.silu):
        self.gate_up, self.down = gate_up, down     # [2I, H], [H, I]
        self.act = act                              # Gemma: gelu (tanh approximation)
        self.inter = down.in_features
        self.limit = limit                          # DeepSeek-V4: gate clamped above, up both sides

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gu = self.gate_up(x)
        gate, up = gu[..., : self.inter], gu[..., self.inter:]
        if self.limit is not None:
            gate, up = gate.clamp(max=self.limit), up.clamp(min=-self.limit, max=self.limit)
        return self.down(self.act(gate) * up)
