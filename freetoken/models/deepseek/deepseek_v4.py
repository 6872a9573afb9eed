"""DeepSeek-V4 (Flash / Pro): every layer attends a sliding window with sinks, plus per
`layer_types` the entries of a compressed sparse (CSA) or heavily compressed (HCA) branch
(`layers/attention/v4.py`, `layers/attention/compressor.py`); hyper-connections carry `hc_mult`
residual streams (`layers/hyper.py`); MoE in every layer, the first `hash_moe` ones routed
by a token-id table, the rest by sqrt-softplus scores with a correction bias; experts and
the shared expert use a clamped SwiGLU (`swiglu_limit`).

Tensor names are DeepSeek's own (`layers.N.attn.wq_a`, `ffn.experts.E.w1`, ...), which is
also what transformers' save_pretrained writes, with or without a leading `model.`.
Multi-token-prediction weights (`mtp.*`) are never read."""
from __future__ import annotations

import torch

from ...errors import CheckpointError
from ...experts.memory.pool import ExpertSpec, PoolBuilder
from ...layers.attention.compressor import Compressor
from ...layers.hyper import HyperConnection, HyperHead
from ...layers.linear import Linear, LinearFactory
from ...layers.mlp import GatedMLP
from ...layers.moe import BiasCorrectedMoE, HashRoutedMoE
from ...layers.norm import RMSNorm
from ...layers.rope import inv_freq_and_scale
from ...layers.state import SequenceState, SlidingWindowKV, check_positions
from ...layers.attention.v4 import V4Attention
from ..context import ForwardContext
from ..decoder import MoECausalLM, model_basics, tiny_base, tiny_moe_inter
from ...quant.fp8 import quantize_fp8_block
from ...quant.mxfp4 import quantize_mxfp4

ATTENTION_TYPES = ("sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention")
DEFAULT_COMPRESS_RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}


def rope_tables(cfg: dict, max_len: int, device) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """'main' and 'compress' cos/sin [max_len, rope_dim / 2] (one angle per interleaved pair)."""
    params = cfg.get("rope_parameters") or {}
    head_dim = cfg["head_dim"]
    prf = cfg.get("partial_rotary_factor") or (cfg.get("qk_rope_head_dim") or 64) / head_dim
    if not (isinstance(params.get("main"), dict) and isinstance(params.get("compress"), dict)):
        scaling = {k: v for k, v in (cfg.get("rope_scaling") or params).items() if k not in ("main", "compress")}
        compress = {**scaling, "rope_theta": cfg.get("compress_rope_theta", 160000.0)}
        if compress.get("rope_type", compress.get("type", "default")) == "yarn":
            compress.setdefault("attention_factor", 1.0)
        params = {"main": {"rope_type": "default", "rope_theta": cfg.get("rope_theta", 10000.0)}, "compress": compress}
    out = {}
    for kind in ("main", "compress"):
        p = dict(params[kind])
        p["rope_type"] = p.get("rope_type", p.get("type", "default")) or "default"
        p.setdefault("partial_rotary_factor", prf)
        if p["rope_type"] == "yarn":
            p.setdefault("original_max_position_embeddings", cfg.get("original_max_position_embeddings")
                         or cfg.get("max_position_embeddings"))
        inv, scale, _ = inv_freq_and_scale(p, head_dim, cfg.get("max_position_embeddings", max_len))
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv)
        out[kind] = ((freqs.cos() * scale).to(device), (freqs.sin() * scale).to(device))
    return out


class V4Layer:
    def __init__(self, i, attn, mlp, hash_routed, attn_norm, ffn_norm, attn_hc, ffn_hc, rope_kind):
        self.i, self.attn, self.mlp, self.hash = i, attn, mlp, hash_routed
        self.attn_norm, self.ffn_norm, self.attn_hc, self.ffn_hc, self.rope_kind = (
            attn_norm, ffn_norm, attn_hc, ffn_hc, rope_kind)

    def __call__(self, streams, input_ids, positions, ctx, rope, tables):
        cos, sin = rope[self.rope_kind]
        post, comb, h = self.attn_hc(streams)
        a = self.attn(self.attn_norm(h), cos, sin, positions, ctx, self.i, tables)
        streams = HyperConnection.expand(post, comb, a, streams)
        post, comb, h = self.ffn_hc(streams)
        h = self.ffn_norm(h)
        m = self.mlp(h, input_ids) if self.hash else self.mlp(h)
        return HyperConnection.expand(post, comb, m, streams)


class DeepseekV4ForCausalLM(MoECausalLM):
    @classmethod
    def tiny_config(cls, layers, experts, top_k, hidden, vocab):
        return "DeepseekV4Config", dict(
            tiny_base(layers, hidden, vocab, kv_heads=1), head_dim=hidden // 2, q_lora_rank=hidden // 2,
            moe_intermediate_size=tiny_moe_inter(hidden), n_routed_experts=experts, num_experts_per_tok=top_k,
            sliding_window=8, o_groups=2, o_lora_rank=hidden // 4, index_n_heads=16, index_head_dim=hidden // 4,
            index_topk=4, hc_mult=2, partial_rotary_factor=0.25,
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
            layer_types=[("sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention")[i % 3]
                         for i in range(layers)],
            mlp_layer_types=["hash_moe" if i == 0 else "moe" for i in range(layers)])

    def __init__(self, ck, cfg, max_len: int):  # noqa: C901 - one pass over the checkpoint
        hf, pool = model_basics(self, ck, cfg, max_len, eps_default=1e-6)
        self.ck_dir, device = ck.dir, self.device
        self.layer_types = list(hf.get("layer_types") or [])
        self.mlp_types = list(hf.get("mlp_layer_types") or [])
        for name, types, allowed in (("layer_types", self.layer_types, ATTENTION_TYPES),
                                     ("mlp_layer_types", self.mlp_types, ("hash_moe", "moe"))):
            if len(types) != self.num_layers or any(t not in allowed for t in types):
                raise CheckpointError(f"{hf.path}: field {name!r} must list one of {allowed} per layer "
                                      f"({self.num_layers} layers)")
        self.c = {k: hf.data.get(k) for k in ("num_attention_heads", "head_dim", "hidden_size", "q_lora_rank",
                                              "sliding_window", "o_groups", "o_lora_rank", "index_n_heads",
                                              "index_head_dim", "index_topk")}
        self.c["rms_norm_eps"] = self.eps
        self.c["compress_rates"] = hf.get("compress_rates") or DEFAULT_COMPRESS_RATES
        missing = [k for k, v in self.c.items() if v is None]
        if missing:
            raise CheckpointError(f"{hf.path}: field {missing[0]!r} is missing (DeepSeek-V4 needs it)")
        self.hc, self.limit = hf.req("hc_mult"), float(hf.get("swiglu_limit", 10.0))
        self.linear = LinearFactory(self.dtype, cfg.torch_dtype, cfg.dense_format, pool, self.choices.prefill_gemm)
        self.rope = rope_tables(hf.data, max_len, device)
        self.prefix = "model." if ck.has("model.layers.0.attn.wq_a.weight") else ""
        get = self._getter(ck)
        self.embed = self._first(ck, ["model.embed_tokens.weight", "embed.weight"],
                                 (self.vocab_size, self.hidden), cfg.torch_dtype).to(device)
        self.norm = RMSNorm(self._first(ck, ["model.norm.weight", "norm.weight"], (self.hidden,)).to(device), self.eps)
        hc_flat = self.hc * self.hidden
        self.hc_head = HyperHead(self._first(ck, ["model.hc_head.hc_fn", "hc_head_fn"], (self.hc, hc_flat)),
                                 self._first(ck, ["model.hc_head.hc_base", "hc_head_base"], (self.hc,)),
                                 self._first(ck, ["model.hc_head.hc_scale", "hc_head_scale"], (1,)),
                                 float(hf.get("hc_eps", 1e-6)), self.eps)
        head = self._first(ck, ["head.weight", "lm_head.weight"], (self.vocab_size, self.hidden), self.linear.storage_dtype,
                           optional=True)
        self.lm_head = self.linear(head.to(device) if head is not None else self.embed)
        self.moe_layers = list(range(self.num_layers))
        self.experts = self._load_experts(ck)
        self.layers = [self._load_layer(ck, get, i) for i in range(self.num_layers)]

    # --- names ----------------------------------------------------------------------------
    def _getter(self, ck):
        def get(name, shape=None, dtype=torch.float32):
            return ck.get_float(self.prefix + name, shape, dtype).to(self.device)
        return get

    def _linear_loader(self, ck):
        def lin(name, shape):
            return self.linear.load(ck, [self.prefix + name], [shape], device=self.device)
        return lin

    def _first(self, ck, names, shape, dtype=torch.float32, optional=False):
        for n in names:
            if ck.has(n):
                return ck.get_float(n, shape, dtype)
        if optional:
            return None
        raise CheckpointError(f"{ck.dir}: tensor {names[-1]!r} not found in the checkpoint")

    # --- hooks the engine reads -------------------------------------------------------------
    @classmethod
    def kv_rows(cls, hf):
        return []           # windows and compressed entries are per-sequence states

    def num_experts(self) -> int:
        return self.hf.req("n_routed_experts")

    def expert_intermediate(self) -> int:
        return self.hf.req("moe_intermediate_size")

    @classmethod
    def new_state(cls, hf, max_len, kv_dtype, act_dtype, device) -> SequenceState:
        """The keys-only window ring of every layer, and each compressor's buffers and entries
        (the main one's at head_dim, CSA's indexer's at index_head_dim), room for max_len tokens."""
        d, n = hf.req("head_dim"), hf.req("num_hidden_layers")
        parts = {"window": SlidingWindowKV(n, hf.req("sliding_window"), 1, d, kv_dtype, device, values=False)}
        rates = hf.get("compress_rates") or DEFAULT_COMPRESS_RATES
        for i, t in enumerate(hf.get("layer_types") or []):
            if t not in rates:
                continue
            csa, rate = t == "compressed_sparse_attention", rates[t]
            parts[f"compress{i}"] = Compressor.new_state(rate, d, csa, max_len // rate + 1, kv_dtype, device)
            if csa:
                parts[f"index{i}"] = Compressor.new_state(rate, hf.req("index_head_dim"), True, max_len // rate + 1,
                                                          kv_dtype, device)
        return SequenceState(parts)

    # --- loading ---------------------------------------------------------------------------
    def build_pool(self, ck):
        """Float experts, or FP4 as V4-Flash ships them: `w1/w2/w3.weight` int8 [out, in/2] (two
        e2m1 per byte, low nibble first) with one UE8M0 scale per 32 inputs in `weight_scale_inv`
        [out, in/32] -- byte for byte the MXFP4 banks, so they stay packed."""
        e, inter, h = self.num_experts(), self.expert_intermediate(), self.hidden
        p0 = f"{self.prefix}layers.0.ffn.experts.0.w1"
        fp4 = ck.has(f"{p0}.weight_scale_inv") and ck.get(f"{p0}.weight").dtype in (torch.int8, torch.uint8)
        spec = ExpertSpec(hidden=h, intermediate=inter, fmt="mxfp4" if fp4 else "float", activation="silu_clamp",
                          limit=self.limit)
        b, dt = PoolBuilder(self.num_layers, e, spec), self.expert_dtype
        for i in range(self.num_layers):
            p = f"{self.prefix}layers.{i}.ffn.experts"
            for x in range(e):
                if fp4:
                    blk = {n: (ck.get(f"{p}.{x}.{n}.weight", (o, k // 2)).view(torch.uint8).reshape(o, k // 32, 16),
                               ck.get(f"{p}.{x}.{n}.weight_scale_inv", (o, k // 32)).view(torch.uint8))
                           for n, o, k in (("w1", inter, h), ("w3", inter, h), ("w2", h, inter))}
                    b.put("gate_up_blocks", i, x, torch.cat([blk["w1"][0], blk["w3"][0]]), torch.uint8)
                    b.put("gate_up_scales", i, x, torch.cat([blk["w1"][1], blk["w3"][1]]), torch.uint8)
                    b.put("down_blocks", i, x, blk["w2"][0], torch.uint8)
                    b.put("down_scales", i, x, blk["w2"][1], torch.uint8)
                    continue
                w = {n: self.linear.load(ck, [f"{p}.{x}.{n}.weight"], [s]).dequantized().to(dt)
                     if ck.has(f"{p}.{x}.{n}.weight_scale_inv") else ck.get_float(f"{p}.{x}.{n}.weight", s, dt)
                     for n, s in (("w1", (inter, h)), ("w3", (inter, h)), ("w2", (h, inter)))}
                b.put("gate_up", i, x, torch.cat([w["w1"], w["w3"]]), dt)
                b.put("down", i, x, w["w2"], dt)
        return b.build()

    def _load_layer(self, ck, get, i: int) -> V4Layer:
        p, h, e = f"layers.{i}", self.hidden, self.num_experts()
        lin = self._linear_loader(ck)
        attn = V4Attention(get, lin, self.linear, f"{p}.attn", self.c, self.layer_types[i], self.device)
        inter, sp = self.expert_intermediate(), f"{self.prefix}{p}.ffn.shared_experts"
        shared = GatedMLP(self.linear.load(ck, [f"{sp}.w1.weight", f"{sp}.w3.weight"], [(inter, h), (inter, h)],
                                           device=self.device),
                          lin(f"{p}.ffn.shared_experts.w2.weight", (h, inter)), limit=self.limit)
        router = Linear(get(f"{p}.ffn.gate.weight", (e, h)), compute_dtype=torch.float32,
                        storage_dtype=torch.float32, pool=self.linear.pool)
        scale, score, k = float(self.hf.get("routed_scaling_factor", 1.0)), self.hf.get("scoring_func", "sqrtsoftplus"), \
            self.top_k()
        hashed = self.mlp_types[i] == "hash_moe"
        if hashed:
            table = ck.get(f"{self.prefix}{p}.ffn.gate.tid2eid", (self.vocab_size, k)).to(self.device)
            mlp = HashRoutedMoE(i, router, self.experts, k, table, scale, shared=shared, score=score)
        else:
            mlp = BiasCorrectedMoE(i, router, self.experts, k, True, get(f"{p}.ffn.gate.bias", (e,)), 1, 1, scale,
                                   shared=shared, score=score)
        hc = self.hc
        conn = [HyperConnection(get(f"{p}.hc_{n}_fn", ((2 + hc) * hc, hc * h)), get(f"{p}.hc_{n}_base", ((2 + hc) * hc,)),
                                get(f"{p}.hc_{n}_scale", (3,)), hc, int(self.hf.get("hc_sinkhorn_iters", 20)),
                                float(self.hf.get("hc_eps", 1e-6)), self.eps) for n in ("attn", "ffn")]
        norms = [RMSNorm(get(f"{p}.{n}.weight", (h,)), self.eps) for n in ("attn_norm", "ffn_norm")]
        kind = "main" if self.layer_types[i] == "sliding_attention" else "compress"
        return V4Layer(i, attn, mlp, hashed, *norms, *conn, kind)

    # --- compute ---------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        check_positions(ctx.states, ctx.query_lens, positions)
        self.experts.begin_step(ctx.phase, len(input_ids))
        x = self.embed_tokens(input_ids)
        streams = x.unsqueeze(1).expand(-1, self.hc, -1).contiguous()
        rope = {k: (c.index_select(0, positions), s.index_select(0, positions)) for k, (c, s) in self.rope.items()}
        for layer in self.layers:
            streams = layer(streams, input_ids, positions, ctx, rope, self.rope["compress"])
        for st, n in zip(ctx.states, ctx.query_lens):
            st.advance(n)
        return self.norm(self.hc_head(streams))


def quantize_checkpoint(model_dir) -> None:
    """Rewrite a float V4 checkpoint the way V4-Flash ships: attention/indexer/shared-expert
    projections as FP8 e4m3 with UE8M0 128x128 block scales, routed experts as FP4 (e2m1 pairs
    in int8, one UE8M0 scale per 32). Used by make-tiny and the tests."""
    import json
    import re
    from pathlib import Path

    from safetensors.torch import load_file, save_file


    dense = re.compile(r"\.(attn\.(wq_a|wq_b|wkv|wo_a|wo_b|indexer\.wq_b)|ffn\.shared_experts\.w[123])\.weight$")
    expert = re.compile(r"\.ffn\.experts\.\d+\.w[123]\.weight$")
    d = Path(model_dir)
    for f in sorted(d.glob("*.safetensors")):
        out = {}
        for name, t in load_file(str(f)).items():
            if dense.search(name):
                q, s = quantize_fp8_block(t, pow2=True)
                out[name], out[name + "_scale_inv"] = q, s.to(torch.float8_e8m0fnu)
            elif expert.search(name):
                blocks, scales = quantize_mxfp4(t)
                out[name] = blocks.reshape(t.shape[0], -1).view(torch.int8)
                out[name + "_scale_inv"] = scales.view(torch.float8_e8m0fnu)
            else:
                out[name] = t
        save_file(out, str(f), metadata={"format": "pt"})
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128], "scale_fmt": "ue8m0", "expert_dtype": "fp4"}
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
