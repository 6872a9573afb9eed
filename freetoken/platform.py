"""Facts about the machine that decide how to compute, read once."""
from __future__ import annotations

import functools
import platform as _platform
from pathlib import Path

import torch

# ISA flags with native bf16 matmul instructions (kernels/choices.py decides on them too)
NATIVE_BF16 = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


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
    return bool(cpu_flags() & NATIVE_BF16)


GEMM_ALIGN = 64     # bytes: what torch's CPU allocator gives every fresh tensor


def gemm_aligned(t):
    """`t`, or a copy at a GEMM_ALIGN-byte address when it is not at one. MKL's sgemm rounds
    differently with the alignment of its operands on some CPUs (a Zen 4, torch 2.13 / MKL 2024.2:
    an [11, 64] x [64, 64]^T product changes in the last bit when one operand moves by 4 bytes;
    offsets of 16 bytes agree). Weights read in place from a safetensors file sit at the file's
    offsets, those of an FTW file or a fresh tensor at 64 bytes, so the same model loaded from
    both gave different logits. Weights that enter a torch GEMM go through here: every load of
    a model then computes the same bits."""
    return t if t.data_ptr() % GEMM_ALIGN == 0 else t.clone(memory_format=torch.contiguous_format)
