"""DeepSeek-V3.2: DeepSeek-V3 with DeepSeek sparse attention in every layer. MLA attends
only the `index_topk` keys the lightning indexer picks for each query (`layers/attention/dsa.py`);
the indexer's keys extend each latent cache row. Dense/MoE layers follow `mlp_layer_types`."""
from __future__ import annotations

from dataclasses import replace

from ...layers.attention.dsa import Indexer
from ...layers.attention.mla import MLA
from .deepseek_v3 import DeepseekV3ForCausalLM, latent_row


class DeepseekV32ForCausalLM(DeepseekV3ForCausalLM):
    @classmethod
    def tiny_config(cls, layers, experts, top_k, hidden, vocab):
        _, v3 = DeepseekV3ForCausalLM.tiny_config(layers, experts, top_k, hidden, vocab)
        return "DeepseekV32Config", dict(v3, index_topk=8, index_head_dim=hidden // 4, index_n_heads=8)

    def __init__(self, ck, cfg, max_len: int):
        super().__init__(ck, cfg, max_len)

    def is_moe_layer(self, i: int) -> bool:
        types = self.hf.get("mlp_layer_types")
        if types is None:
            return super().is_moe_layer(i)
        return self.num_experts() > 0 and types[i] == "sparse"

    @classmethod
    def kv_rows(cls, hf):
        """One row per token: latent, rope key, indexer key."""
        return [(i, 1, latent_row(hf) + hf.req("index_head_dim"), False) for i in range(hf.req("num_hidden_layers"))]

    @classmethod
    def gathered_values(cls, hf):
        """MLA's latent and rope key, and the indexer keys the indexer gathers in fp32 (dsa.py)."""
        return latent_row(hf), hf.req("index_head_dim")

    def attention(self, ck, i: int):
        p = f"model.layers.{i}.self_attn"
        # the reference always interleaves MLA's rope dims in V3.2 (the config field is ignored)
        attn = MLA(ck, p, replace(self.mla, rope_interleave=True), self.linear, self.rotary, self.dtype, self.device)
        attn.indexer = Indexer(ck, f"{p}.indexer", self.hf, self.linear, self.rotary, self.dtype, self.device)
        return attn
