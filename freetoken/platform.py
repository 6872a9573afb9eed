"""Facts about the machine that decide how to compute, read once."""
from __future__ import annotations

import functools
import platform as _platform
from pathlib import Path

import torch


@functools.cache
def cpu_info() -> dict[str, str]:
    """The fields of /proc/cpuinfo, first occurrence of each (read once per process; empty off Linux)."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, sep, value = line.partition(":")
            if sep:
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


def cpu_flags() -> frozenset[str]:
    """The ISA feature flags (x86 "flags", ARM "Features")."""
    info = cpu_info()
    return frozenset((info.get("flags") or info.get("Features") or "").split())


def cpu_model() -> str:
    return cpu_info().get("model name") or _platform.processor() or _platform.machine()


def cpu_signature() -> str:
    """What a binary compiled with -march=native depends on: the model and its feature flags."""
    return f"{cpu_model()}|{' '.join(sorted(cpu_flags()))}|{_platform.machine()}"


def cpu_has_fast_bf16() -> bool:
    """Native bf16 matmul instructions (AVX512-BF16/AMX, ARM bf16). Without them torch's bf16
    GEMM converts element by element: on the AVX2 dev machine a 512-token prefill of the medium
    Qwen3-MoE ran 68 tok/s with bf16 dense layers against 144 tok/s in fp32 (decode: 16.2 vs 14.6)."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"})


def compute_dtype(weights: torch.dtype, device: torch.device, requested: str) -> torch.dtype:
    """Dtype of the activations (dense weights keep their storage dtype, see layers/linear.py).
    "auto": the checkpoint dtype, except half types on a CPU without native support, where
    activations are float32: torch's bf16 GEMM is 2x slower than fp32 there, and our GEMV reads
    the bf16 weights either way."""
    if requested != "auto":
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[requested]
    if device.type == "cpu" and weights in (torch.bfloat16, torch.float16) and not cpu_has_fast_bf16():
        return torch.float32
    return weights
