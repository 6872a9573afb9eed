"""GLM-4.5 / 4.6 / 4.7 (`Glm4MoeForCausalLM`): GQA with partial rotary (half the head by
default) and optional per-head q/k norm; the first `first_k_dense_replace` layers are dense;
MoE layers route with sigmoid scores, a selection-only correction bias, expert groups and
`routed_scaling_factor`, plus an ungated shared expert. The multi-token-prediction layer (stored
after the last decoder layer) is read by `models/mtp_head.py` for `--speculative mtp`."""
from __future__ import annotations

from dataclasses import replace

import torch

from ...errors import CheckpointError
from ...layers.linear import Linear
from ...layers.moe import BiasCorrectedMoE
from ..decoder import ArchSpec, MoECausalLM, tiny_base, tiny_moe_inter


class Glm4MoeForCausalLM(MoECausalLM):
    arch = ArchSpec()

    @classmethod
    def tiny_config(cls, layers, experts, top_k, hidden, vocab):
        return "Glm4MoeConfig", dict(
            tiny_base(layers, hidden, vocab), head_dim=hidden // 4, intermediate_size=2 * hidden,
            moe_intermediate_size=tiny_moe_inter(hidden), n_routed_experts=experts, num_experts_per_tok=top_k,
            n_shared_experts=1, first_k_dense_replace=1,
            n_group=2 if experts % 2 == 0 and top_k <= experts // 2 else 1, topk_group=1,
            routed_scaling_factor=2.5, use_qk_norm=True, norm_topk_prob=True, partial_rotary_factor=0.5)

    def __init__(self, ck, cfg, max_len: int):
        if ck.config.get("use_qk_norm"):
            self.arch = replace(self.arch, qk_norm="head")
        super().__init__(ck, cfg, max_len)

    def rope_config(self) -> dict:
        data = self.hf.data
        if "partial_rotary_factor" in data or "partial_rotary_factor" in (data.get("rope_parameters") or {}):
            return data
        return {**data, "partial_rotary_factor": 0.5}     # GLM's config class implies half-head rotary

    def num_experts(self) -> int:
        return self.hf.first("n_routed_experts", "num_local_experts", default=0)

    def is_moe_layer(self, i: int) -> bool:
        return self.num_experts() > 0 and i >= self.hf.get("first_k_dense_replace", 1)

    def _load_moe(self, ck, i: int):
        p, e = f"model.layers.{i}.mlp", self.num_experts()
        # routing decides on fp32 scores (transformers keeps the gate and bias in fp32)
        router = Linear(ck.get_float(f"{p}.gate.weight", (e, self.hidden)).to(self.device),
                        compute_dtype=torch.float32, storage_dtype=torch.float32, pool=self.linear.pool)
        bias_name = f"{p}.gate.e_score_correction_bias"
        bias = (ck.get_float(bias_name, (e,)) if ck.has(bias_name) else torch.zeros(e)).to(self.device)
        n_shared = self.hf.get("n_shared_experts", 1)
        shared = self._gated_mlp(ck, f"{p}.shared_experts", self.expert_intermediate() * n_shared) if n_shared else None
        n_group = self.hf.get("n_group", 1)
        if e % n_group:
            raise CheckpointError(f"{ck.dir}/config.json: n_routed_experts {e} is not divisible by n_group {n_group}")
        return BiasCorrectedMoE(self.moe_layers.index(i), router, self.experts, self.top_k(),
                                bool(self.hf.get("norm_topk_prob", True)), bias, n_group, self.hf.get("topk_group", 1),
                                self.hf.first("routed_scaling_factor", default=1.0, kind=float), shared=shared)
