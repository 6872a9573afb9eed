"""DeepSeek-V4 GGUFs (`deepseek4`, llama.cpp's converter from the checkpoint as DeepSeek ships
it): the names our V4 model reads (models/deepseek/deepseek_v4.py, the release's own layout without the
`model.` prefix) and the config fields its metadata holds. Per layer the compress ratio says the
attention kind: 0 a sliding window only, a layer with indexer tensors compressed sparse (CSA),
any other ratio heavily compressed (HCA); the first `hash_layer_count` layers route by token id."""
from __future__ import annotations

import re

from ...errors import CheckpointError

GLOBAL = {"token_embd.weight": "embed.weight", "output.weight": "head.weight", "output_norm.weight": "norm.weight",
          "output_hc_fn.weight": "hc_head_fn", "output_hc_base.weight": "hc_head_base",
          "output_hc_scale.weight": "hc_head_scale"}
# blk.N.<part> -> layers.N.<name>
BLOCK = {
    "attn_sinks.weight": "attn.attn_sink", "attn_q_a.weight": "attn.wq_a.weight",
    "attn_q_a_norm.weight": "attn.q_norm.weight", "attn_q_b.weight": "attn.wq_b.weight",
    "attn_kv.weight": "attn.wkv.weight", "attn_kv_a_norm.weight": "attn.norm.weight",
    "attn_output_a.weight": "attn.wo_a.weight", "attn_output_b.weight": "attn.wo_b.weight",
    "attn_compressor_ape.weight": "attn.compressor.ape", "attn_compressor_kv.weight": "attn.compressor.wkv.weight",
    "attn_compressor_gate.weight": "attn.compressor.wgate.weight",
    "attn_compressor_norm.weight": "attn.compressor.norm.weight",
    "indexer.attn_q_b.weight": "attn.indexer.wq_b.weight", "indexer.proj.weight": "attn.indexer.weights_proj.weight",
    "indexer_compressor_ape.weight": "attn.indexer.compressor.ape",
    "indexer_compressor_kv.weight": "attn.indexer.compressor.wkv.weight",
    "indexer_compressor_gate.weight": "attn.indexer.compressor.wgate.weight",
    "indexer_compressor_norm.weight": "attn.indexer.compressor.norm.weight",
    "attn_norm.weight": "attn_norm.weight", "ffn_norm.weight": "ffn_norm.weight",
    "ffn_gate_inp.weight": "ffn.gate.weight", "exp_probs_b.bias": "ffn.gate.bias",
    "ffn_gate_tid2eid.weight": "ffn.gate.tid2eid",
    "ffn_gate_shexp.weight": "ffn.shared_experts.w1.weight", "ffn_up_shexp.weight": "ffn.shared_experts.w3.weight",
    "ffn_down_shexp.weight": "ffn.shared_experts.w2.weight",
    **{f"hc_{s}_{p}.weight": f"hc_{s}_{p}" for s in ("attn", "ffn") for p in ("fn", "base", "scale")},
}
_BLK = re.compile(r"blk\.(\d+)\.(.+)$")


def hf_names(name: str) -> tuple[str, ...]:
    if name in GLOBAL:
        return (GLOBAL[name],)
    m = _BLK.match(name)
    if m and m[2] in BLOCK:
        return (f"layers.{m[1]}.{BLOCK[m[2]]}",)
    return ()


def config_fields(c: dict, m, tensors: dict) -> None:
    """The V4 fields of the HF-style config (models/deepseek/deepseek_v4.py reads them)."""
    layers = c["num_hidden_layers"]
    ratios = list(m.req("attention.compress_ratios"))[:layers]
    if len(ratios) != layers:
        raise CheckpointError(f"{m.path}: {m.arch}.attention.compress_ratios has {len(ratios)} entries, "
                              f"expected {layers} (one per layer)")
    kinds, rates = [], {}
    for i, r in enumerate(ratios):
        kind = ("sliding_attention" if not r else "compressed_sparse_attention"
                if f"blk.{i}.indexer.proj.weight" in tensors else "heavily_compressed_attention")
        if r and rates.setdefault(kind, int(r)) != int(r):
            raise CheckpointError(f"{m.path}: {m.arch}.attention.compress_ratios mixes ratios {rates[kind]} and {r} "
                                  f"for {kind} layers (one ratio per kind expected)")
        kinds.append(kind)
    hashed = int(m.get("hash_layer_count", 0))
    gating = int(m.get("expert_gating_func", 4))
    scoring = {1: "softmax", 2: "sigmoid", 4: "sqrtsoftplus"}.get(gating)
    if scoring is None:
        raise CheckpointError(f"{m.path}: {m.arch}.expert_gating_func = {gating} is not supported "
                              "(expected 4, sqrt-softplus, as DeepSeek-V4 routes; or 1 / 2)")
    limits = m.get("swiglu_clamp_exp") or [10.0]
    experts = c["num_experts"]
    c.update(layer_types=kinds, compress_rates=rates, mlp_layer_types=["hash_moe" if i < hashed else "moe"
                                                                       for i in range(layers)],
             n_routed_experts=experts, n_shared_experts=int(m.get("expert_shared_count", 1)),
             moe_intermediate_size=int(m.req("expert_feed_forward_length")),
             routed_scaling_factor=float(m.get("expert_weights_scale", 1.0)), scoring_func=scoring,
             norm_topk_prob=bool(m.get("expert_weights_norm", True)),
             q_lora_rank=int(m.req("attention.q_lora_rank")), sliding_window=int(m.req("attention.sliding_window")),
             o_groups=int(m.req("attention.output_group_count")), o_lora_rank=int(m.req("attention.output_lora_rank")),
             index_n_heads=int(m.req("attention.indexer.head_count")),
             index_head_dim=int(m.req("attention.indexer.key_length")),
             index_topk=int(m.req("attention.indexer.top_k")),
             hc_mult=int(m.req("hyper_connection.count")),
             hc_sinkhorn_iters=int(m.get("hyper_connection.sinkhorn_iterations", 20)),
             hc_eps=float(m.get("hyper_connection.epsilon", 1e-6)),
             swiglu_limit=float(max(limits) if isinstance(limits, list) else limits),
             qk_rope_head_dim=int(m.req("rope.dimension_count")),
             rope_theta=c["rope_parameters"]["rope_theta"],
             compress_rope_theta=float(m.get("attention.compress_rope_freq_base", 160000.0)),
             num_nextn_predict_layers=0)
