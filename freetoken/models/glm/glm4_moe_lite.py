"""GLM-4.7-Flash (`Glm4MoeLiteForCausalLM`): DeepSeek-V3's multi-head latent attention (latent
paged cache, `rope_interleave`) under GLM-4.5's MoE (sigmoid router with correction bias, groups,
`routed_scaling_factor`, shared experts); `mlp_layer_types` says which layers are dense
(default: the first)."""
from __future__ import annotations

from ...errors import CheckpointError
from ..deepseek.deepseek_v3 import DeepseekV3ForCausalLM


class Glm4MoeLiteForCausalLM(DeepseekV3ForCausalLM):
    def is_moe_layer(self, i: int) -> bool:
        n = self.num_layers
        types = self.hf.get("mlp_layer_types") or ["dense"] + ["sparse"] * (n - 1)
        if len(types) < n or any(t not in ("dense", "sparse") for t in types[:n]):
            raise CheckpointError(f"{self.hf.path}: field 'mlp_layer_types' is {types!r}, "
                                  f"expected {n} entries of 'dense'/'sparse'")
        return self.num_experts() > 0 and types[i] == "sparse"
