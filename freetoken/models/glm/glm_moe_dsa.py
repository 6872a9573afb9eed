"""GLM-5 / 5.1 / 5.2 (`GlmMoeDsaForCausalLM`): DeepSeek-V3.2's layout (MLA over a latent paged
cache, DSA lightning indexer, dense first layers, DeepSeek's grouped sigmoid router with shared
experts) with two differences: the indexer's rope is interleaved, and `indexer_types` marks
"shared" layers that run no indexer and reuse the previous "full" layer's top-k selection
(their cache rows then hold no indexer key). Multi-token-prediction layers are never read."""
from __future__ import annotations

from dataclasses import replace

from ...errors import CheckpointError
from ...layers.attention.dsa import Indexer, SharedSelection
from ...layers.attention.mla import MLA
from ..deepseek.deepseek_v3 import DeepseekV3ForCausalLM, latent_row
from ..deepseek.deepseek_v32 import DeepseekV32ForCausalLM


def indexer_types(cfg: dict, path) -> list[str]:
    """`indexer_types`, or the schedule GLM's config class derives it from
    (`index_topk_pattern`, else `index_topk_freq` / `index_skip_topk_offset`)."""
    n = cfg["num_hidden_layers"]
    types = cfg.get("indexer_types")
    if types is None and cfg.get("index_topk_pattern") is not None:
        pattern = cfg["index_topk_pattern"]
        types = [{"F": "full", "S": "shared"}.get(c, c) for c in pattern]
    if types is None:
        freq, offset = max(cfg.get("index_topk_freq") or 1, 1), cfg.get("index_skip_topk_offset", 2)
        types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]
    if len(types) < n or any(t not in ("full", "shared") for t in types[:n]) or types[0] != "full":
        raise CheckpointError(f"{path}: field 'indexer_types' is {types!r}, expected {n} entries of "
                              "'full'/'shared' starting with 'full'")
    return list(types[:n])


class GlmMoeDsaForCausalLM(DeepseekV32ForCausalLM):
    @classmethod
    def tiny_config(cls, layers, experts, top_k, hidden, vocab):
        _, v3 = DeepseekV3ForCausalLM.tiny_config(layers, experts, top_k, hidden, vocab)
        return "GlmMoeDsaConfig", dict(v3, index_topk=8, index_head_dim=hidden // 4, index_n_heads=8,
                                       indexer_types=["full" if i % 2 == 0 else "shared" for i in range(layers)])

    def __init__(self, ck, cfg, max_len: int):
        self.indexer_types = indexer_types(ck.config, ck.dir / "config.json")
        self._full_indexer = None
        super().__init__(ck, cfg, max_len)

    @classmethod
    def kv_rows(cls, hf):
        """One row per token: latent and rope key, plus the indexer key on "full" layers."""
        extra, types = hf.req("index_head_dim"), indexer_types(hf.data, hf.path)
        return [(i, 1, latent_row(hf) + (extra if t == "full" else 0), False) for i, t in enumerate(types)]

    def attention(self, ck, i: int):
        p = f"model.layers.{i}.self_attn"
        attn = MLA(ck, p, replace(self.mla, rope_interleave=True), self.linear, self.rotary, self.dtype, self.device)
        if self.indexer_types[i] == "full":
            attn.indexer = self._full_indexer = Indexer(ck, f"{p}.indexer", self.hf, self.linear, self.rotary,
                                                        self.dtype, self.device, rope_interleave=True)
        else:
            attn.indexer = SharedSelection(self._full_indexer)
        return attn
