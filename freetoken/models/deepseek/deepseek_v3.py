"""DeepSeek-V3 / R1 (and Kimi-K2-style configs that reuse the class): multi-head latent
attention over a latent paged cache (`layers/attention/mla.py`), the first `first_k_dense_replace`
layers dense, then MoE layers with DeepSeek's sigmoid router (correction bias, group-limited
top-k, `routed_scaling_factor`) and shared experts. FP8 (e4m3, 128x128 block scales)
projections and experts are read as shipped: dense ones stay packed in `Linear`, experts in
fp8 banks when their rows fill whole 128-blocks. The multi-token-prediction layer (index
num_hidden_layers) is read by `models/mtp_head.py` for `--speculative mtp`."""
from __future__ import annotations

import torch

from ...layers.linear import Linear
from ...layers.attention.mla import MLA, MLAConfig
from ...layers.moe import BiasCorrectedMoE
from ...layers.norm import RMSNorm
from ..decoder import DecoderLayer, MoECausalLM, tiny_base, tiny_moe_inter
from ...errors import CheckpointError
from ..hf_config import HFConfig


def latent_row(hf) -> int:
    """Values an MLA layer caches per token: the KV latent and the rope key."""
    return hf.req("kv_lora_rank") + hf.first("qk_rope_head_dim", default=0)


class DeepseekV3ForCausalLM(MoECausalLM):
    @classmethod
    def tiny_config(cls, layers, experts, top_k, hidden, vocab):
        return "DeepseekV3Config", dict(
            tiny_base(layers, hidden, vocab, kv_heads=4), intermediate_size=2 * hidden,
            moe_intermediate_size=tiny_moe_inter(hidden), n_routed_experts=experts, num_experts_per_tok=top_k,
            n_shared_experts=1, n_group=max(1, experts // 4), topk_group=max(1, experts // 8),
            first_k_dense_replace=1, kv_lora_rank=hidden // 2, q_lora_rank=hidden // 2,
            qk_nope_head_dim=hidden // 4, qk_rope_head_dim=hidden // 8, v_head_dim=hidden // 4)

    def __init__(self, ck, cfg, max_len: int):
        self.mla = MLAConfig.from_hf(HFConfig(ck.config, ck.dir / "config.json"))
        super().__init__(ck, cfg, max_len)

    def rope_dim(self) -> int:
        return self.mla.qk_rope_head_dim

    def num_experts(self) -> int:
        return self.hf.first("n_routed_experts", default=0)

    def is_moe_layer(self, i: int) -> bool:
        return self.num_experts() > 0 and i >= self.hf.get("first_k_dense_replace", 0)

    @classmethod
    def kv_rows(cls, hf):
        """Every layer keeps one latent row per token (no values)."""
        return [(i, 1, latent_row(hf), False) for i in range(hf.req("num_hidden_layers"))]

    def attention(self, ck, i: int):
        return MLA(ck, f"model.layers.{i}.self_attn", self.mla, self.linear, self.rotary, self.dtype, self.device)

    def _load_moe(self, ck, i: int):
        p, e = f"model.layers.{i}.mlp", self.num_experts()
        # routing decides on fp32 scores (the checkpoint keeps the gate in fp32): no rounding here
        router = Linear(ck.get_float(f"{p}.gate.weight", (e, self.hidden)).to(self.device),
                        compute_dtype=torch.float32, storage_dtype=torch.float32, pool=self.linear.pool)
        bias = ck.get_float(f"{p}.gate.e_score_correction_bias", (e,)).to(self.device) \
            if ck.has(f"{p}.gate.e_score_correction_bias") else torch.zeros(e, device=self.device)
        n_shared = self.hf.get("n_shared_experts", 0)
        shared = self._gated_mlp(ck, f"{p}.shared_experts", self.expert_intermediate() * n_shared) if n_shared else None
        n_group = self.hf.get("n_group", 1)
        if e % n_group:
            raise CheckpointError(f"{ck.dir}/config.json: n_routed_experts {e} is not divisible by n_group {n_group}")
        return BiasCorrectedMoE(self.moe_layers.index(i), router, self.experts, self.top_k(),
                                bool(self.hf.get("norm_topk_prob", True)), bias, n_group,
                                self.hf.get("topk_group", n_group), float(self.hf.get("routed_scaling_factor", 1.0)),
                                shared=shared, score=self.hf.get("scoring_func", "sigmoid"))

    def _load_layer(self, ck, i: int) -> DecoderLayer:
        p = f"model.layers.{i}"
        mlp = self._load_moe(ck, i) if i in self.moe_layers else self._load_mlp(ck, i)
        return DecoderLayer(self.attention(ck, i), mlp,
                            RMSNorm(self._w(ck, f"{p}.input_layernorm.weight", (self.hidden,)), self.eps),
                            RMSNorm(self._w(ck, f"{p}.post_attention_layernorm.weight", (self.hidden,)), self.eps))
