"""RMSNorm, computed in float32 like the reference implementations, then cast back."""
import torch
import torch.nn.functional as F

from ..kernels import cpu_kernels


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32 and weight.dtype == torch.float32 and x.device.type == "cpu" and (lib := cpu_kernels()):
        # decode-sized rows: one C call (~2 us) instead of torch's composite rms_norm (~20 us)
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.shape[-1]
        lib.ft_rms_norm(x.data_ptr(), weight.contiguous().data_ptr(), x.numel() // n, n, eps, out.data_ptr())
        return out
    h = F.rms_norm(x.float(), (x.shape[-1],), eps=eps)   # one fused kernel instead of five ops
    return weight * h.to(x.dtype)


def add_rms_norm(x: torch.Tensor, a: torch.Tensor, norm) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(h = x + a, norm(h)) by one C call for decode-sized fp32 CPU rows (a layer's residual add
    and post-attention norm: the bits of `x + a` then `rms_norm`); None where that path does not
    apply (the caller runs the two ops)."""
    if (type(norm) is not RMSNorm or x.dtype != torch.float32 or a.dtype != torch.float32 or x.device.type != "cpu"
            or x.shape != a.shape or not x.is_contiguous() or not a.is_contiguous()
            or norm.weight.dtype != torch.float32 or not norm.weight.is_contiguous() or (lib := cpu_kernels()) is None):
        return None
    h, out = torch.empty_like(x), torch.empty_like(x)
    n = x.shape[-1]
    lib.ft_add_rms_norm(x.data_ptr(), a.data_ptr(), norm.weight.data_ptr(), x.numel() // n, n, norm.eps,
                        h.data_ptr(), out.data_ptr())
    return h, out


class RMSNorm:
    def __init__(self, weight: torch.Tensor, eps: float):
        self.weight, self.eps = weight, eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)
