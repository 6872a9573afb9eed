"""HF `architectures` name -> model class."""
from __future__ import annotations

import importlib

from ..errors import UnsupportedModelError

# name -> (module under models/, class); modules are imported on demand.
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "Qwen3MoeForCausalLM": ("qwen.qwen3_moe", "Qwen3MoeForCausalLM"),
    "Qwen2MoeForCausalLM": ("qwen.qwen2_moe", "Qwen2MoeForCausalLM"),
    "MixtralForCausalLM": ("mixtral", "MixtralForCausalLM"),
    "OlmoeForCausalLM": ("olmoe", "OlmoeForCausalLM"),
    "Qwen3NextForCausalLM": ("qwen.qwen3_next", "Qwen3NextForCausalLM"),
    "Qwen3_5MoeForCausalLM": ("qwen.qwen3_5_moe", "Qwen3_5MoeForCausalLM"),
    "Qwen3_5MoeForConditionalGeneration": ("qwen.qwen3_5_moe", "Qwen3_5MoeForCausalLM"),
    "GptOssForCausalLM": ("gpt_oss", "GptOssForCausalLM"),
    "Glm4MoeForCausalLM": ("glm.glm4_moe", "Glm4MoeForCausalLM"),
    "Glm4MoeLiteForCausalLM": ("glm.glm4_moe_lite", "Glm4MoeLiteForCausalLM"),
    "GlmMoeDsaForCausalLM": ("glm.glm_moe_dsa", "GlmMoeDsaForCausalLM"),
    "Glm5NextForConditionalGeneration": ("glm.glm5_next", "Glm5NextForConditionalGeneration"),
    "DeepseekV3ForCausalLM": ("deepseek.deepseek_v3", "DeepseekV3ForCausalLM"),
    "DeepseekV32ForCausalLM": ("deepseek.deepseek_v32", "DeepseekV32ForCausalLM"),
    "DeepseekV4ForCausalLM": ("deepseek.deepseek_v4", "DeepseekV4ForCausalLM"),
    "MiniMaxM2ForCausalLM": ("minimax_m2", "MiniMaxM2ForCausalLM"),
    # dense decoders (no experts)
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("mistral", "MistralForCausalLM"),
    "Qwen2ForCausalLM": ("qwen.qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen.qwen3", "Qwen3ForCausalLM"),
    "Gemma3ForCausalLM": ("gemma3", "Gemma3ForCausalLM"),
}


def model_class(config: dict, config_path) -> type:
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs:
        raise UnsupportedModelError(f"{config_path}: field 'architectures' missing or empty "
                                    f"(expected one of {sorted(ARCHITECTURES)})")
    for name in archs:
        if name in ARCHITECTURES:
            module, cls = ARCHITECTURES[name]
            return getattr(importlib.import_module(f"{__package__}.{module}"), cls)
    raise UnsupportedModelError(f"{config_path}: architecture {archs[0]!r} is not supported "
                                f"(supported: {', '.join(sorted(ARCHITECTURES))})")
