"""A GGUF file's metadata (`{arch}.*` keys) as the Hugging Face config.json our model classes
read. Where llama.cpp hard-codes a choice the HF config makes explicit (top-k
renormalisation, gpt-oss's SwiGLU constants), the config states llama.cpp's choice, so a
GGUF runs the way llama.cpp runs it."""
from __future__ import annotations

from ...errors import CheckpointError
from .deepseek4 import config_fields as deepseek4_fields
from .hybrid import config_fields

# GGUF general.architecture -> (HF architectures name, model_type, norm_topk_prob as llama.cpp runs it)
FAMILIES = {
    "qwen3moe": ("Qwen3MoeForCausalLM", "qwen3_moe", True),
    "qwen2moe": ("Qwen2MoeForCausalLM", "qwen2_moe", False),
    "llama": ("MixtralForCausalLM", "mixtral", True),
    "olmoe": ("OlmoeForCausalLM", "olmoe", False),
    "gpt-oss": ("GptOssForCausalLM", "gpt_oss", None),
    "qwen3next": ("Qwen3NextForCausalLM", "qwen3_next", True),
    "qwen35moe": ("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", True),
    "deepseek2": ("DeepseekV3ForCausalLM", "deepseek_v3", False),
    "glm4moe": ("Glm4MoeForCausalLM", "glm4_moe", False),
    "glm-dsa": ("GlmMoeDsaForCausalLM", "glm_moe_dsa", False),
    "deepseek32": ("DeepseekV32ForCausalLM", "deepseek_v32", False),
    "minimax-m2": ("MiniMaxM2ForCausalLM", "minimax_m2", True),
    "deepseek4": ("DeepseekV4ForCausalLM", "deepseek_v4", True),
    # dense decoders ("llama" without expert_count is switched to LlamaForCausalLM in `_llama`)
    "qwen2": ("Qwen2ForCausalLM", "qwen2", None),
    "qwen3": ("Qwen3ForCausalLM", "qwen3", None),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text", None),
}
# families llama.cpp's converter writes that no model class here reads yet: named in the error
NOT_YET = {"glm5-next": "GLM-5 Next", "minimax-m3": "MiniMax-M3", "kimi-linear": "Kimi Linear",
           "kimi-k3": "Kimi-K3"}
GATING = {1: "softmax", 2: "sigmoid", 3: "softmax_weight", 4: "sqrtsoftplus"}   # llama.cpp's expert_gating_func ids


class Meta:
    """Typed reads of `{arch}.key` metadata with one-line errors naming the file and key."""

    def __init__(self, fields: dict, path):
        self.fields, self.path = fields, path
        self.arch = fields.get("general.architecture")

    def get(self, key: str, default=None):
        v = self.fields.get(f"{self.arch}.{key}")
        return default if v is None else v

    def req(self, key: str):
        v = self.get(key)
        if v is None:
            raise CheckpointError(f"{self.path}: metadata key {self.arch}.{key} is missing")
        return v

    def scalar(self, key: str, default=None):
        """Per-layer arrays (head counts of some models) collapse to their largest value."""
        v = self.get(key, default)
        return max(v) if isinstance(v, list) and v else v


def _rope(m: Meta, head_dim: int) -> dict:
    theta = float(m.get("rope.freq_base", 10000.0))
    p = {"rope_type": "default", "rope_theta": theta}
    kind = m.get("rope.scaling.type", "none")
    factor = m.get("rope.scaling.factor")
    if kind == "linear" and factor:
        p.update(rope_type="linear", factor=float(factor))
    elif kind == "yarn":
        p.update(rope_type="yarn", factor=float(factor),
                 original_max_position_embeddings=int(m.req("rope.scaling.original_context_length")),
                 beta_fast=float(m.get("rope.scaling.yarn_beta_fast", 32.0)),
                 beta_slow=float(m.get("rope.scaling.yarn_beta_slow", 1.0)))
        if m.get("rope.scaling.yarn_log_multiplier") is not None:      # deepseek2: mscale_all_dim
            p["mscale_all_dim"] = p["mscale"] = float(m.get("rope.scaling.yarn_log_multiplier")) / 0.1
    elif kind not in ("none", None):
        raise CheckpointError(f"{m.path}: {m.arch}.rope.scaling.type = {kind!r} is not supported "
                              "(expected none, linear or yarn)")
    dims = m.get("rope.dimension_count")
    if dims and dims != head_dim:
        p["partial_rotary_factor"] = dims / head_dim
    return p


def synth_config(fields: dict, tensors: dict, path) -> dict:
    """The HF config dict for a GGUF with metadata `fields` and tensor shapes `tensors`
    (GGUF name -> numpy-order shape)."""
    m = Meta(fields, path)
    if m.arch in NOT_YET:
        raise CheckpointError(f"{path}: general.architecture = {m.arch!r} ({NOT_YET[m.arch]}) is not read "
                              f"from GGUF yet (supported: {', '.join(sorted(FAMILIES))})")
    if m.arch not in FAMILIES:
        raise CheckpointError(f"{path}: general.architecture = {m.arch!r} is not supported "
                              f"(supported: {', '.join(sorted(FAMILIES))})")
    arch, model_type, norm_topk = FAMILIES[m.arch]
    hidden, layers = int(m.req("embedding_length")), int(m.req("block_count"))
    m.req("attention.head_count")
    heads = int(m.scalar("attention.head_count"))
    head_dim = int(m.get("attention.key_length") or hidden // heads)
    vocab = tensors["token_embd.weight"][0]
    tok = lambda k: fields.get(f"tokenizer.ggml.{k}_token_id")  # noqa: E731
    c = {
        "architectures": [arch], "model_type": model_type,
        "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": int(m.scalar("attention.head_count_kv", heads)), "head_dim": head_dim,
        "rms_norm_eps": float(m.get("attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(m.get("context_length", 4096)),
        "vocab_size": int(vocab), "tie_word_embeddings": "output.weight" not in tensors,
        "intermediate_size": int(m.scalar("feed_forward_length", 0)),
        "bos_token_id": tok("bos"), "eos_token_id": tok("eos"), "pad_token_id": tok("padding"),
        "rope_parameters": _rope(m, head_dim),
    }
    experts = int(m.get("expert_count", 0))
    if experts:
        c.update(num_experts=experts, num_local_experts=experts,
                 num_experts_per_tok=int(m.req("expert_used_count")))
        if m.get("expert_feed_forward_length"):
            c["moe_intermediate_size"] = int(m.get("expert_feed_forward_length"))
        norm = m.get("expert_weights_norm")
        if norm is not None or norm_topk is not None:
            c["norm_topk_prob"] = bool(norm if norm is not None else norm_topk)
    if m.get("attention.clamp_kqv"):
        c["clip_qkv"] = float(m.get("attention.clamp_kqv"))
    FAMILY_FIELDS.get(m.arch, lambda *a: None)(c, m, tensors)
    return c


def _qwen2moe(c, m, tensors):
    c["shared_expert_intermediate_size"] = int(m.req("expert_shared_feed_forward_length"))
    c["qkv_bias"] = "blk.0.attn_q.bias" in tensors


def _qwen3moe(c, m, tensors):
    c["attention_bias"] = "blk.0.attn_q.bias" in tensors


def _llama(c, m, tensors):
    if "rope_freqs.weight" in tensors:
        raise CheckpointError(f"{m.path}: llama3-style rope frequency factors (rope_freqs.weight) are not supported")
    if not c.get("num_experts"):             # dense: Llama 2/3, SmolLM2, Mistral
        c.update(architectures=["LlamaForCausalLM"], model_type="llama",
                 intermediate_size=int(m.req("feed_forward_length")), attention_bias="blk.0.attn_q.bias" in tensors)
        if m.get("attention.sliding_window"):
            c.update(architectures=["MistralForCausalLM"], model_type="mistral",
                     sliding_window=int(m.get("attention.sliding_window")))
        return
    c["intermediate_size"] = int(m.req("expert_feed_forward_length") if m.get("expert_feed_forward_length")
                                 else m.req("feed_forward_length"))
    c["sliding_window"] = m.get("attention.sliding_window")


def _dense(c, m, tensors):
    """Dense qwen2/qwen3: the MLP width is required; qwen3 files may carry q/k/v biases."""
    c["intermediate_size"] = int(m.req("feed_forward_length"))
    c["attention_bias"] = "blk.0.attn_q.bias" in tensors


def _gemma3(c, m, tensors):
    """Gemma 3 as llama.cpp runs it (src/models/gemma3.cpp): five sliding layers per full one
    unless the file says otherwise, local layers on rope base freq_base_swa (10000), queries
    scaled by 1/sqrt(head_dim) (27B: 1/sqrt(hidden/heads)); the converter stored every norm
    weight with Gemma's +1 already added."""
    _dense(c, m, tensors)
    layers, window = c["num_hidden_layers"], m.get("attention.sliding_window")
    pattern = m.get("attention.sliding_window_pattern", 6)
    if window:
        c["sliding_window"] = int(window)
        if isinstance(pattern, list):
            c["layer_types"] = ["sliding_attention" if s else "full_attention" for s in pattern[:layers]]
        else:
            c["layer_types"] = ["sliding_attention" if pattern == 0 or i % pattern < pattern - 1 else "full_attention"
                                for i in range(layers)]
    else:
        c["layer_types"] = ["full_attention"] * layers
    full = c.pop("rope_parameters")
    c["rope_parameters"] = {"full_attention": full, "sliding_attention": {
        "rope_type": "default", "rope_theta": float(m.get("rope.freq_base_swa", 10000.0))}}
    c["query_pre_attn_scalar"] = (c["hidden_size"] // c["num_attention_heads"] if layers == 62
                                  else c["head_dim"])
    if m.get("final_logit_softcapping"):
        c["final_logit_softcapping"] = float(m.get("final_logit_softcapping"))
    c["norm_weights_shifted"] = True
    c["tie_word_embeddings"] = "output.weight" not in tensors


def _gpt_oss(c, m, tensors):
    c["intermediate_size"] = int(m.req("expert_feed_forward_length"))
    c["attention_bias"] = True
    window = int(m.req("attention.sliding_window"))
    c["sliding_window"] = window
    # llama.cpp: every other layer slides, starting with layer 0 (as transformers' default)
    c["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(c["num_hidden_layers"])]
    c["swiglu_alpha"], c["swiglu_limit"] = 1.702, 7.0
    if c["rope_parameters"]["rope_type"] == "yarn":
        c["rope_parameters"]["truncate"] = False


def _hybrid(c, m, tensors):
    if m.get("nextn_predict_layers"):      # multi-token-prediction blocks at the end: not run
        c["num_hidden_layers"] -= int(m.get("nextn_predict_layers"))
    config_fields(c, m, tensors)


def _routed(c, m, tensors, gating_default: int):
    """DeepSeek-style routing shared by deepseek2 and glm4moe: leading dense blocks, shared
    experts, groups, sigmoid scores (softmax for DeepSeek-V2, whose groups rank by their best
    expert as the original model does, where llama.cpp sums the best two); next-token-prediction
    blocks counted in block_count are dropped (they sit after the decoder layers and are never
    read). Weights are renormalised only when expert_weights_norm says so (llama.cpp's default)."""
    c["num_hidden_layers"] -= int(m.get("nextn_predict_layers", 0))
    c["num_nextn_predict_layers"] = int(m.get("nextn_predict_layers", 0))   # blk.N.nextn.*: --speculative mtp
    gating = int(m.get("expert_gating_func", gating_default))
    if GATING.get(gating) not in ("sigmoid", "softmax"):
        raise CheckpointError(f"{m.path}: {m.arch}.expert_gating_func = {gating} ({GATING.get(gating, 'unknown')}"
                              f"{', the default when the key is absent' if m.get('expert_gating_func') is None else ''})"
                              " is not supported (expected 2, sigmoid: DeepSeek-V3/R1, Kimi-K2, GLM-4.5+; "
                              "or 1, softmax: DeepSeek-V2)")
    c.update(n_routed_experts=c["num_experts"], n_shared_experts=int(m.get("expert_shared_count", 0)),
             first_k_dense_replace=int(m.get("leading_dense_block_count", 0)),
             routed_scaling_factor=float(m.get("expert_weights_scale", 1.0)),
             n_group=int(m.get("expert_group_count", 1)), topk_group=int(m.get("expert_group_used_count", 1)),
             scoring_func=GATING[gating])
    c.setdefault("norm_topk_prob", False)


def _deepseek2(c, m, tensors):
    # llama.cpp's default gating for a deepseek2 file without the key: softmax (DeepSeek-V2),
    # except the GLM-4.7-Lite shape (47/48 blocks, 154880 tokens)
    lite_glm = c["num_hidden_layers"] in (47, 48) and c["vocab_size"] == 154880
    _routed(c, m, tensors, 2 if lite_glm else 1)
    _mla(c, m)


def _mla(c, m):
    """Multi-head latent attention's fields (deepseek2 and the DSA families)."""
    rope = int(m.req("rope.dimension_count"))
    if m.get("attention.key_length_mla") is not None:     # split k_b/v_b (converters since 2025)
        qk, v = int(m.req("attention.key_length_mla")), int(m.req("attention.value_length_mla"))
    else:                                                  # older files: one attn_kv_b
        qk, v = int(m.req("attention.key_length")), int(m.req("attention.value_length"))
    q_lora = m.get("attention.q_lora_rank")
    c.update(kv_lora_rank=int(m.req("attention.kv_lora_rank")), q_lora_rank=int(q_lora) if q_lora else None,
             qk_nope_head_dim=qk - rope, qk_rope_head_dim=rope, qk_head_dim=qk, v_head_dim=v, head_dim=rope,
             num_key_value_heads=c["num_attention_heads"], rope_interleave=True, attention_bias=False)
    c["rope_parameters"].pop("partial_rotary_factor", None)    # MLA: the rope part is its own head


def _glm4moe(c, m, tensors):
    _routed(c, m, tensors, 2)
    c["use_qk_norm"] = "blk.0.attn_q_norm.weight" in tensors
    c["attention_bias"] = "blk.0.attn_q.bias" in tensors
    c["rope_parameters"].setdefault("partial_rotary_factor", 1.0)


def _dsa(c, m, tensors):
    """DeepSeek-V3.2 (`deepseek32`) and GLM-5 (`glm-dsa`): deepseek2's MLA and routing plus the
    lightning indexer; glm-dsa marks per layer whether it runs its own indexer ("full") or
    reuses the previous full layer's selection ("shared"). Dense/MoE layers follow
    leading_dense_block_count (mlp_layer_types is what the model classes read)."""
    _routed(c, m, tensors, 2)       # both route on sigmoid scores (llama.cpp's glm-dsa default)
    _mla(c, m)
    c.update(index_n_heads=int(m.req("attention.indexer.head_count")),
             index_head_dim=int(m.req("attention.indexer.key_length")),
             index_topk=int(m.req("attention.indexer.top_k")))
    dense = c["first_k_dense_replace"]
    c["mlp_layer_types"] = ["dense" if i < dense else "sparse" for i in range(c["num_hidden_layers"])]
    types = m.get("attention.indexer.types")
    if types is not None:
        c["indexer_types"] = ["full" if t else "shared" for t in types][:c["num_hidden_layers"]]


def _minimax_m2(c, m, tensors):
    c["intermediate_size"] = int(m.req("expert_feed_forward_length"))
    c["rotary_dim"] = int(m.get("rope.dimension_count", c["head_dim"]))


FAMILY_FIELDS = {"qwen2": _dense, "qwen3": _dense, "gemma3": _gemma3, "qwen2moe": _qwen2moe, "qwen3moe": _qwen3moe,
                 "llama": _llama, "gpt-oss": _gpt_oss, "qwen3next": _hybrid, "qwen35moe": _hybrid,
                 "deepseek2": _deepseek2, "glm4moe": _glm4moe, "glm-dsa": _dsa, "deepseek32": _dsa,
                 "minimax-m2": _minimax_m2, "deepseek4": deepseek4_fields}
