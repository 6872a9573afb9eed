"""Qwen3.5 / Qwen3.6 MoE: Qwen3-Next's hybrid layout with separate in_proj_qkv/z/b/a,
every layer MoE, top-k always renormalised. Also reads the text part of
`Qwen3_5MoeForConditionalGeneration` checkpoints (config under `text_config`, weights
under `model.language_model.*`; `model.visual.*` and `mtp.*` are never read). For text
the multimodal rope (mrope) gives every section the same position, i.e. plain rope."""
from __future__ import annotations

from dataclasses import replace

import torch

from .qwen3_next import Qwen3NextForCausalLM
from ..decoder import tiny_base, tiny_moe_inter


def text_part(config: dict) -> dict:
    """The language model's config of a multimodal one (a flat text-only config as it is)."""
    text = dict(config.get("text_config") or config)
    for k in ("tie_word_embeddings",):
        if k not in text and k in config:
            text[k] = config[k]
    return text


class LanguageModelView:
    """A checkpoint seen through its language model: `model.X` reads `model.language_model.X`."""

    def __init__(self, ck):
        self._ck, self.dir = ck, ck.dir
        self.config = text_part(ck.config)

    def _name(self, name: str) -> str:
        return "model.language_model." + name[6:] if name.startswith("model.") else name

    def has(self, name):
        return self._ck.has(self._name(name))

    def get(self, name, shape=None):
        return self._ck.get(self._name(name), shape)

    def get_float(self, name, shape=None, dtype=torch.float32):
        return self._ck.get_float(self._name(name), shape, dtype)

    def names(self):
        return self._ck.names()

    def prebuilt_experts(self):
        return self._ck.prebuilt_experts()

    def reading(self, section: str):
        return self._ck.reading(section)

    def close(self):
        self._ck.close()


class Qwen3_5MoeForCausalLM(Qwen3NextForCausalLM):
    arch = replace(Qwen3NextForCausalLM.arch, always_norm_topk=True)

    @classmethod
    def tiny_config(cls, layers, experts, top_k, hidden, vocab):
        return "Qwen3_5MoeTextConfig", dict(
            tiny_base(layers, hidden, vocab), head_dim=hidden // 4, moe_intermediate_size=tiny_moe_inter(hidden),
            shared_expert_intermediate_size=hidden, num_experts=experts, num_experts_per_tok=top_k,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=hidden // 4,
            linear_value_head_dim=hidden // 4,
            layer_types=["full_attention" if i % 2 else "linear_attention" for i in range(layers)])

    @classmethod
    def text_config(cls, config: dict) -> dict:
        return text_part(config)

    def __init__(self, ck, cfg, max_len: int):
        if isinstance(ck.config.get("text_config"), dict):
            ck = LanguageModelView(ck)
        super().__init__(ck, cfg, max_len)
