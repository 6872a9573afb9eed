"""Facts about the machine that decide how to compute, read once."""
from __future__ import annotations

import functools
from pathlib import Path


@functools.cache
def cpu_flags() -> frozenset[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_has_fast_bf16() -> bool:
    """Native bf16 matmul instructions (AVX512-BF16/AMX, ARM bf16). Without them torch's bf16
    GEMM converts element by element: on the AVX2 dev machine a 512-token prefill of the medium
    Qwen3-MoE ran 68 tok/s with bf16 dense layers against 144 tok/s in fp32 (decode: 16.2 vs 14.6)."""
    from .kernels.choices import NATIVE_BF16
    return bool(cpu_flags() & NATIVE_BF16)
