"""`--speculative mtp`: the checkpoint's nextn layer (models/mtp_head.py) read next to the model,
its routed experts a one-layer bank of their own run by the CPU executor (resident on a
device). A bank of its own rather than extra ids in the main pool: the main pool's layer count
is what the memory plan, the tiers' caches, the disk layouts and the verify price are built
on, and the nextn layer is one layer in 47-62; this bank is not tiered and not in the memory
plan (see docs/speculative.md)."""
from __future__ import annotations

import dataclasses

import torch

from ..config import EngineConfig, Settings
from ..errors import InvalidRequestError
from ..models.mtp_head import MTPHead, missing_heads
from .experts_backend import build_experts


def load_mtp_heads(model, ck, cfg: EngineConfig, settings: Settings, with_format) -> MTPHead:
    """The nextn layer of `model`'s checkpoint `ck`, experts attached; one line when it has none."""
    why = missing_heads(model, ck)
    if why is not None:
        raise InvalidRequestError(f"--speculative mtp: {why}")
    head = MTPHead(model, ck)
    if head.moe:
        nextn_experts = getattr(ck, "nextn_experts", None)       # a GGUF's blk.N.ffn_*_exps
        pool = nextn_experts(head.index) if nextn_experts else with_format(head.build_pool(ck), cfg.expert_format)
        device = torch.device(cfg.torch_device)
        backend = "resident" if device.type == "cuda" else "cpu"
        experts, _ = build_experts(pool, dataclasses.replace(cfg, record_routing=None), device,
                                   dataclasses.replace(settings, moe_backend=backend))
        head.attach_experts(experts)
    return head
