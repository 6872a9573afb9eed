"""A decoder-only MoE transformer assembled from shared layers. Architecture files
describe their differences (names, norms, biases, routing) with an `ArchSpec`."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import CheckpointError
from ..experts.base import ExpertsSeat
from ..experts.execution.numerics import set_bf16_dot
from ..experts.memory.pool import ExpertSpec, PoolBuilder
from ..kernels.choices import model_kernels
from ..layers.attention.paged import kv_values_per_token, paged_attention
from ..layers.attention.decode_half import FUSED as ATTN_HALF, AttnHalf
from ..layers.attention.decode_stack import STACK, DecodeStack
from ..layers.attention.verify_half import VerifyHalf
from ..layers.ggml_linear import GgmlEmbedding, GgmlLinear
from ..layers.linear import LinearFactory
from ..layers.mlp import GatedMLP
from ..layers.moe import SparseMoE
from ..layers.kernel_rows import GEMV_TOKENS
from ..layers.norm import RMSNorm, add_rms_norm
from ..layers.rope import Rotary, norm_rope_qk
from ..weights import modelopt
from ..weights.checkpoint import Checkpoint
from ..quant.fp8 import block_scales
from ..quant.nvfp4 import pack_scales
from .cache_spec import CacheSpec, allocated_bytes, snapshot_part_bytes
from .context import BuildContext, ForwardContext
from .hf_config import HFConfig

# up to this many rows (a decode token, a verify of up to 15 drafts) q/k norms + rope take
# rope.norm_rope_qk's 2n + 1 C calls instead of the per-tensor path's ~10 calls and copies
FUSED_QK_ROWS = 16


@dataclass(frozen=True)
class ArchSpec:
    qk_norm: str | None = None                  # "head": RMSNorm per head; "full": over the whole projection
    attn_bias_fields: tuple = ("attention_bias",)
    attn_bias_default: bool = False
    moe_prefix: str = "mlp"
    router_name: str = "gate"
    expert_names: tuple = ("gate_proj", "up_proj", "down_proj")
    shared_expert: bool = False
    norm_topk_default: bool = False
    always_norm_topk: bool = False


def tiny_base(layers: int, hidden: int, vocab: int, heads: int = 4, kv_heads: int = 2) -> dict:
    """The config fields every `tiny_config` recipe shares."""
    return dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv_heads, max_position_embeddings=4096, tie_word_embeddings=False)


def tiny_moe_inter(hidden: int) -> int:
    """A tiny checkpoint's expert width."""
    return max(16, hidden // 2)


class Attention:
    def __init__(self, ck: Checkpoint, p: str, hf: HFConfig, arch: ArchSpec, linear: LinearFactory, device,
                 rotary: Rotary, window: int | None):
        self.heads = hf.req("num_attention_heads")
        self.kv_heads = hf.first("num_key_value_heads", default=self.heads)
        hidden = hf.req("hidden_size")
        self.head_dim = hf.first("head_dim", default=hidden // self.heads)
        bias = any(hf.get(f) for f in arch.attn_bias_fields) if any(
            f in hf.data for f in arch.attn_bias_fields) else arch.attn_bias_default
        q_out, kv_out = self.heads * self.head_dim, self.kv_heads * self.head_dim
        dtype = linear.compute_dtype
        get = lambda n, s, dt=dtype: ck.get_float(n, s, dt).to(device)  # noqa: E731
        parts = (("q", q_out), ("k", kv_out), ("v", kv_out))
        qkv_bias = torch.cat([get(f"{p}.{n}_proj.bias", (o,)) for n, o in parts]) if bias else None
        # float parts: a view of the file's pages when adjacent; GGUF quantized: kept packed
        self.qkv = linear.load_rows(ck, [f"{p}.{n}_proj.weight" for n, _ in parts], [(o, hidden) for _, o in parts],
                                    qkv_bias, device)
        o_bias = get(f"{p}.o_proj.bias", (hidden,)) if bias and ck.has(f"{p}.o_proj.bias") else None
        self.o = linear.load_rows(ck, [f"{p}.o_proj.weight"], [(hidden, q_out)], o_bias, device)
        eps = hf.first("rms_norm_eps", default=1e-6, kind=float)
        self.q_norm = self.k_norm = None
        if arch.qk_norm == "head":
            self.q_norm = RMSNorm(get(f"{p}.q_norm.weight", (self.head_dim,)), eps)
            self.k_norm = RMSNorm(get(f"{p}.k_norm.weight", (self.head_dim,)), eps)
        elif arch.qk_norm == "full":
            self.q_norm = RMSNorm(get(f"{p}.q_norm.weight", (q_out,)), eps)
            self.k_norm = RMSNorm(get(f"{p}.k_norm.weight", (kv_out,)), eps)
        self.qk_norm = arch.qk_norm
        self.clip = hf.get("clip_qkv")
        self.rotary, self.window = rotary, window
        self.prefill_dtype = linear.gemm_dtype   # bf16 where native bf16 GEMM was measured faster
        self.splits = (q_out, kv_out, kv_out)
        self.scale = self.head_dim ** -0.5

    def __call__(self, x, cos, sin, cache, meta):
        n = x.shape[0]
        qkv = self.qkv(x)
        if n <= FUSED_QK_ROWS and self.clip is None and self.qk_norm != "full" and (qk := norm_rope_qk(
                qkv, self.heads, self.kv_heads, self.head_dim, self.rotary.dim, self.q_norm, self.k_norm, cos, sin)):
            # a decoding token or a verify's few on the CPU: q/k norms and rope in 2n + 1 C calls
            v = qkv[:, self.splits[0] + self.splits[1]:].view(n, self.kv_heads, self.head_dim)
            o = paged_attention(*qk, v, cache, meta, self.scale, self.window, self.prefill_dtype)
            return self.o(o.reshape(n, -1))
        q, k, v = qkv.split(self.splits, dim=-1)
        if self.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)
        if self.clip is not None:
            q, k, v = q.clamp(-self.clip, self.clip), k.clamp(-self.clip, self.clip), v.clamp(-self.clip, self.clip)
        q = q.reshape(n, self.heads, self.head_dim)
        k = k.reshape(n, self.kv_heads, self.head_dim)
        v = v.reshape(n, self.kv_heads, self.head_dim)
        if self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary.apply(q, cos, sin), self.rotary.apply(k, cos, sin)
        o = paged_attention(q, k, v, cache, meta, self.scale, self.window, self.prefill_dtype)
        return self.o(o.reshape(n, -1))


class DecoderLayer:
    half_attention = Attention     # the attention class whose math `ft_attn_half` computes (not a subclass's)
    row_stack = True    # a step's row through this class's layers takes `DecodeStack` (a subclass says so itself)
    slot = None         # a sliding-window layer's index in its sequence's ring (`row_ring`), else None

    def __init__(self, attn, mlp, input_norm: RMSNorm, post_norm: RMSNorm):
        self.attn, self.mlp, self.input_norm, self.post_norm = attn, mlp, input_norm, post_norm
        self.half = False       # the one-call attention half (layers/attention/decode_half.py): unset, None or built
        # only the step's next layer reads this layer's output (the model marks all but its last;
        # the last one's outlives the step: an MTP drafter keeps it), so a decode row may reuse it
        self.interior = False

    def __call__(self, idx, x, cos, sin, ctx: ForwardContext):
        if (out := self.row_call(x, cos, sin, ctx, ctx.kv[idx])) is not None:
            return out
        if (out := self.rows_call(x, cos, sin, ctx, ctx.kv[idx])) is not None:
            return out
        a = self.attn(self.input_norm(x), cos, sin, ctx.kv[idx], ctx.attn)
        if x.shape[0] <= GEMV_TOKENS and (fused := add_rms_norm(x, a, self.post_norm)) is not None:
            h, normed = fused          # a decode step's residual add and norm in one C call
        else:
            h = x + a
            normed = self.post_norm(h)
        return h + self.mlp(normed)

    def row_call(self, x, cos, sin, ctx: ForwardContext, cache, ring=None) -> torch.Tensor | None:
        """A one-row decode step's layer output: the attention half (and a SparseMoE's router GEMV)
        in one C call, then a SparseMoE's experts and the residual add in another (on rows set up
        once: its `moe`); None where the step does not take it (the caller runs the separate
        calls). cache / ring: where the layer's keys are (`AttnHalf.__call__`)."""
        if x.shape[0] != 1 or not ATTN_HALF[0] or (half := self._half()) is None \
                or (hn := half(x, cos, sin, cache, ctx.attn, ring)) is None:
            return None
        if half.moe is not None and self.mlp.row_live(half.moe):
            return half.moe()
        return hn[0] + self.mlp(hn[1]) if hn[2] is None else self.mlp(hn[1], hn[2], hn[0])

    def rows_call(self, x, cos, sin, ctx: ForwardContext, cache) -> torch.Tensor | None:
        """A verify's few rows (2..FUSED_QK_ROWS, where the separate calls take q/k norms + rope
        in C too) of one sequence: the attention half in one C call (`VerifyHalf`), then the MLP
        and the residual add as the separate path runs them; None where the step does not take
        it. Keys in the paged cache only (a ring layer's rows keep the separate calls)."""
        n = x.shape[0]
        if not 1 < n <= FUSED_QK_ROWS or not ATTN_HALF[0] or self.slot is not None or (half := self._half()) is None:
            return None
        if half.ggml:       # GGUF layers keep the separate calls (their T-row GEMVs are not tested
            #                 through this call): no rows' scratch for them
            return None
        if half.rows is None:
            half.rows = VerifyHalf(half, FUSED_QK_ROWS)
        if (hn := half.rows(x, cos, sin, cache, ctx.attn)) is None:
            return None
        return hn[0] + self.mlp(hn[1])

    def row_ring(self, ctx: ForwardContext) -> tuple | None:
        """(the step's one sequence's ring, this layer's index in it) where this layer's keys are
        in a ring (`slot`), else None: its keys in the paged cache."""
        return None

    def row_norms(self) -> tuple:
        """(input, post-attention) norms as `AttnHalf` takes them (plain `RMSNorm`s)."""
        return self.input_norm, self.post_norm

    def _half(self) -> AttnHalf | None:
        """This layer's `AttnHalf`, built on first use (the plain `Attention` only: a subclass's
        other math never takes it; a plain `SparseMoE`'s router GEMV joins the call, and its
        experts' call is set up on the half's rows), rebuilt if its weights were replaced."""
        if self.half is False or (self.half is not None and self.half.stale()):
            router = self.mlp.router if type(self.mlp) is SparseMoE else None    # (its own routing rule only)
            half = (AttnHalf.build(self.attn, *self.row_norms(), router)
                    if type(self.attn) is self.half_attention else None)
            if half is not None and half.logits is not None:
                half.moe = self.mlp.decode_row(half.normed, half.logits, half.h, not self.interior)
            self.half = half
        return self.half


def model_basics(model, ck: Checkpoint, cfg: BuildContext, max_len: int, eps_default: float):
    """What every model class reads first, set on `model`: its config, the kernels' choices
    (and the bf16 dot the torch expert executors follow), activation / expert / KV dtypes, the
    sizes. The KV cache keeps the checkpoint's precision (e.g. bf16) even under fp32
    activations: half the bytes per decoded token at long contexts. Returns (config, the
    kernels' thread pool or None)."""
    hf = HFConfig(ck.config, ck.dir / "config.json")
    model.hf, model.cfg, model.max_len = hf, cfg, max_len
    model.device = cfg.torch_device
    model.expert_dtype = model.kv_dtype = cfg.torch_dtype   # routed experts keep the checkpoint precision
    pool, model.choices = model_kernels(cfg)
    if pool is not None:
        set_bf16_dot(pool.lib, model.choices.bf16_dot)
    model.dtype = model.choices.activations
    model.num_layers, model.hidden = hf.req("num_hidden_layers"), hf.req("hidden_size")
    model.vocab_size = hf.req("vocab_size")
    model.eps = hf.first("rms_norm_eps", default=eps_default, kind=float)
    return hf, pool


class MoECausalLM:
    """Embedding -> decoder layers -> final norm -> lm_head, with experts behind the seam."""

    arch = ArchSpec()
    embed_rows = None       # GgmlEmbedding of a GGUF's quantized table (else `embed` holds floats)
    mtp = None              # the nextn layer (models/mtp_head.py), loaded for --speculative mtp
    kernel_switches = None  # the kernel switches its choices set (kernels/switch_set.py), kept by the loader
    decode_stack = None     # a one-row decode step's call through every layer (layers/attention/decode_stack.py)

    def __init__(self, ck: Checkpoint, cfg: BuildContext, max_len: int):
        hf, pool = model_basics(self, ck, cfg, max_len, eps_default=1e-6)
        device, dtype = self.device, self.dtype
        heads = hf.req("num_attention_heads")
        self.head_dim = hf.first("head_dim", default=self.hidden // heads)
        self.kv_heads = hf.first("num_key_value_heads", default=heads)
        self.rotary = Rotary(self.rope_config(), self.rope_dim(), max_len, dtype, device)
        self.linear = LinearFactory(dtype, cfg.torch_dtype, cfg.dense_format, pool, self.choices.prefill_gemm)
        self._load_ends(ck)
        self.moe_layers = [i for i in range(self.num_layers) if self.is_moe_layer(i)]
        self.experts = self._load_experts(ck) if self.moe_layers else None
        self.layers = [self._load_layer(ck, i) for i in range(self.num_layers)]
        for layer in self.layers[:-1]:
            if isinstance(layer, DecoderLayer):
                layer.interior = True

    # --- architecture hooks -------------------------------------------------------------
    def _w(self, ck, name, shape):
        return ck.get_float(name, shape, self.dtype).to(self.device)

    def _ws(self, ck, name, shape):
        """A dense weight matrix in its storage dtype (for `self.linear`)."""
        return ck.get_float(name, shape, self.linear.storage_dtype).to(self.device)

    def rope_config(self) -> dict:
        """The config fields the rotary tables read (a hook for architectures with implied defaults)."""
        return self.hf.data

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.embed_rows is not None:
            return self.embed_rows(input_ids).to(self.dtype)
        if input_ids.dim() == 1:       # F.embedding's rows without its Python wrapper (a decode step's cost)
            return self.embed.index_select(0, input_ids).to(self.dtype)
        return F.embedding(input_ids, self.embed).to(self.dtype)

    def num_experts(self) -> int:
        return self.hf.first("num_experts", "num_local_experts", default=0)

    def top_k(self) -> int:
        k, n = self.hf.req("num_experts_per_tok"), self.num_experts()
        if n and not 1 <= k <= n:
            raise CheckpointError(f"config.json: num_experts_per_tok is {k}, but the model has {n} "
                                  "experts (expected 1..number of experts)")
        return k

    def expert_intermediate(self) -> int:
        return self.hf.first("moe_intermediate_size", "intermediate_size")

    def is_moe_layer(self, i: int) -> bool:
        step = self.hf.get("decoder_sparse_step", 1) or 1
        return (self.num_experts() > 0 and i not in (self.hf.get("mlp_only_layers") or [])
                and (i + 1) % step == 0)

    def sliding_window(self, i: int) -> int | None:
        types = self.hf.get("layer_types")
        if types and types[i] == "sliding_attention":
            return self.hf.get("sliding_window") or None
        return None

    def rope_dim(self) -> int:
        """Features per head the rotary tables cover (before partial_rotary_factor)."""
        return self.head_dim

    # --- a small random-weight checkpoint of this architecture (`freetoken make-tiny`) -------
    tiny_model: str | None = None   # transformers' model class for it, where AutoModelForCausalLM builds another

    @classmethod
    def tiny_config(cls, layers: int, experts: int, top_k: int, hidden: int, vocab: int) -> tuple[str, dict] | None:
        """(transformers config class name, its arguments) for make-tiny, or None: make-tiny
        offers the class under its module's name when the class defines this itself (one that
        extends another architecture does not inherit its recipe)."""
        return None

    # --- what the model keeps per token and per sequence: from the config alone ------------
    @classmethod
    def text_config(cls, config: dict) -> dict:
        """The config of the text model (a hook for checkpoints that nest it)."""
        return config

    @classmethod
    def kv_rows(cls, hf: HFConfig) -> list[tuple]:
        """(layer index, kv heads, head dim) of every layer that keeps paged K and V, or
        (layer index, 1, row size, False) of a layer that keeps one latent row per token."""
        heads = hf.req("num_attention_heads")
        head_dim = hf.first("head_dim", default=hf.req("hidden_size") // heads)
        kv_heads = hf.first("num_key_value_heads", default=heads)
        return [(i, kv_heads, head_dim) for i in range(hf.req("num_hidden_layers"))]

    @classmethod
    def new_state(cls, hf: HFConfig, max_len: int, kv_dtype: torch.dtype, act_dtype: torch.dtype, device):
        """One sequence's recurrent/window/compressed state (hybrid models); None if it keeps none."""
        return None

    @classmethod
    def cache_spec(cls, config: dict, path, max_len: int, kv_dtype: torch.dtype,
                   act_dtype: torch.dtype) -> CacheSpec:
        """What `kv_layers()` and `make_state()` allocate for a model of this config."""
        hf = HFConfig(cls.text_config(config), path)
        state = cls.new_state(hf, max_len, kv_dtype, act_dtype, "meta")
        return CacheSpec(tuple(cls.kv_rows(hf)), kv_dtype, allocated_bytes(state), snapshot_part_bytes(state))

    @classmethod
    def gathered_values(cls, hf: HFConfig) -> tuple[int, int]:
        """Values per token one attention layer gathers when it reads a whole context out of the
        paged cache (layers/attention/paged.gather, the CUDA fallback): (those converted to the compute
        dtype, those an indexer converts to fp32). By default its widest `kv_rows` entry, K and V
        or a latent row; a model whose rows all live in states gathers none."""
        return max((kv_values_per_token([row]) for row in cls.kv_rows(hf)), default=0), 0

    @classmethod
    def expert_extra_bytes(cls, hf: HFConfig) -> int:
        """Bytes the pool holds for one expert beyond its gate/up/down weights in the expert
        format (models whose `build_pool` adds banks, e.g. biases)."""
        return 0

    def kv_layers(self) -> list[tuple]:
        return self.kv_rows(self.hf)

    def make_state(self):
        return self.new_state(self.hf, self.max_len, self.kv_dtype, self.dtype, self.device)

    # --- loading -------------------------------------------------------------------------
    def _load_ends(self, ck: Checkpoint):
        """Embedding table, final norm and lm_head (tied to the embedding when the checkpoint says
        so or has none). The table stays in the storage dtype; looked-up rows are converted (exactly)."""
        shape = (self.vocab_size, self.hidden)
        packed = ck.packed("model.embed_tokens.weight", shape) if self.linear.packs_ggml(ck, self.device) else None
        if packed is not None:          # GGUF: rows dequantized as looked up
            self.embed, self.embed_rows = None, GgmlEmbedding(packed, self.cfg.torch_dtype, self.linear.pool)
        else:
            self.embed = ck.get_float("model.embed_tokens.weight", shape, self.cfg.torch_dtype).to(self.device)
            self.embed_rows = None
        self.norm = RMSNorm(self._w(ck, "model.norm.weight", (self.hidden,)), self.eps)
        if self.hf.get("tie_word_embeddings", False) or not ck.has("lm_head.weight"):
            self.lm_head = (self.linear(self.embed) if packed is None
                            else GgmlLinear([packed], None, self.linear.pool, self.linear.gemm_dtype))
        else:
            self.lm_head = self.linear.load_rows(ck, ["lm_head.weight"], [shape], device=self.device)

    def _load_experts(self, ck: Checkpoint):
        """The seat the MoE layers reach the experts through; the loader builds the pool
        (`build_pool`) and the backend once the model is built and attaches them. It reads the
        experts from `expert_checkpoint`: the checkpoint as this model reads it (a view of the
        language model's tensors for a multimodal wrapper)."""
        self.pool, self.expert_checkpoint = None, ck
        return ExpertsSeat()

    def attach_experts(self, pool, experts) -> None:
        """The loader's last step: the pool (an `ExpertPool`, or the disk tier's `DiskLayout`) and
        the experts backend built over it, seated where the MoE layers reach them."""
        self.experts.backend = experts
        self.pool, self.experts, self.expert_checkpoint = pool, experts, None

    def build_pool(self, ck: Checkpoint):
        e, inter, h = self.num_experts(), self.expert_intermediate(), self.hidden
        g, u, d = self.arch.expert_names
        p0 = f"model.layers.{self.moe_layers[0]}.{self.arch.moe_prefix}.experts.0.{g}.weight"
        if modelopt.is_nvfp4(ck, p0) and h % 32 == 0 and inter % 32 == 0:
            return self._nvfp4_pool(ck)
        if ck.has(f"{p0}_scale_inv") and inter % 128 == 0:   # else read below, dequantized by get_float
            return self._fp8_pool(ck)
        b = PoolBuilder(len(self.moe_layers), e, ExpertSpec(hidden=h, intermediate=inter))
        dt = self.expert_dtype
        for m, i in enumerate(self.moe_layers):
            p = f"model.layers.{i}.{self.arch.moe_prefix}.experts"
            if ck.has(f"{p}.gate_up_proj"):       # transformers-5 fused layout
                b.put_layer("gate_up", m, ck.get_float(f"{p}.gate_up_proj", (e, 2 * inter, h), dt), dt)
                b.put_layer("down", m, ck.get_float(f"{p}.down_proj", (e, h, inter), dt), dt)
                continue
            for x in range(e):
                gate = ck.get_float(f"{p}.{x}.{g}.weight", (inter, h), dt)
                up = ck.get_float(f"{p}.{x}.{u}.weight", (inter, h), dt)
                b.put("gate_up", m, x, torch.cat([gate, up]), dt)
                b.put("down", m, x, ck.get_float(f"{p}.{x}.{d}.weight", (h, inter), dt), dt)
        return b.build()

    def _fp8_pool(self, ck: Checkpoint):
        """FP8 e4m3 experts with 128x128 block scales (DeepSeek-V3, GLM-4.5-FP8, Qwen3-FP8 layout:
        `weight` + `weight_scale_inv` per expert matrix) kept packed in fp8 banks; gate and up
        stack into whole 128-row blocks because the intermediate size is a multiple of 128."""
        e, inter, h = self.num_experts(), self.expert_intermediate(), self.hidden
        g, u, d = self.arch.expert_names
        b = PoolBuilder(len(self.moe_layers), e, ExpertSpec(hidden=h, intermediate=inter, fmt="fp8"))
        blocks = lambda r, c: (-(-r // 128), -(-c // 128))  # noqa: E731
        for m, i in enumerate(self.moe_layers):
            p = f"model.layers.{i}.{self.arch.moe_prefix}.experts"
            for x in range(e):
                (gw, gs), (uw, us), (dw, ds) = [
                    (ck.get(f"{p}.{x}.{n}.weight", s),
                     block_scales(ck.get(f"{p}.{x}.{n}.weight_scale_inv", blocks(*s))))
                    for n, s in ((g, (inter, h)), (u, (inter, h)), (d, (h, inter)))]
                b.put("gate_up", m, x, torch.cat([gw, uw]), torch.float8_e4m3fn)
                b.put("gate_up_scale_inv", m, x, torch.cat([gs, us]), torch.float32)
                b.put("down", m, x, dw, torch.float8_e4m3fn)
                b.put("down_scale_inv", m, x, ds, torch.float32)
        return b.build()

    def _nvfp4_pool(self, ck: Checkpoint):
        """ModelOpt NVFP4 experts kept packed: gate and up rows stacked, each row's scale row
        carrying its own matrix's global scale (quant/nvfp4.py)."""
        e, inter, h = self.num_experts(), self.expert_intermediate(), self.hidden
        g, u, d = self.arch.expert_names
        b = PoolBuilder(len(self.moe_layers), e, ExpertSpec(hidden=h, intermediate=inter, fmt="nvfp4"))
        for m, i in enumerate(self.moe_layers):
            p = f"model.layers.{i}.{self.arch.moe_prefix}.experts"
            for x in range(e):
                parts = [modelopt.read_nvfp4(ck, f"{p}.{x}.{n}.weight", s)
                         for n, s in ((g, (inter, h)), (u, (inter, h)), (d, (h, inter)))]
                (gb, gs, gg), (ub, us, ug), (db, ds, dg) = parts
                b.put("gate_up_blocks", m, x, torch.cat([gb, ub]), torch.uint8)
                b.put("gate_up_scales", m, x, pack_scales(torch.cat([gs, us]), torch.cat([gg, ug])), torch.uint8)
                b.put("down_blocks", m, x, db, torch.uint8)
                b.put("down_scales", m, x, pack_scales(ds, dg), torch.uint8)
        return b.build()

    def _load_mlp(self, ck: Checkpoint, i: int):
        p = f"model.layers.{i}.mlp"
        inter = self.hf.req("intermediate_size")
        if not ck.has(f"{p}.gate_proj.weight"):
            raise CheckpointError(f"{ck.dir}: layer {i} is dense by config but tensor {p}.gate_proj.weight is missing")
        return self._gated_mlp(ck, p, inter)

    def _gated_mlp(self, ck: Checkpoint, p: str, inter: int) -> GatedMLP:
        """`{p}.gate_proj/up_proj/down_proj`, float or FP8 block-scaled."""
        h, load = self.hidden, self.linear.load
        return GatedMLP(load(ck, [f"{p}.gate_proj.weight", f"{p}.up_proj.weight"], [(inter, h), (inter, h)],
                             device=self.device),
                        load(ck, [f"{p}.down_proj.weight"], [(h, inter)], device=self.device))

    def _load_moe(self, ck: Checkpoint, i: int):
        p = f"model.layers.{i}.{self.arch.moe_prefix}"
        e = self.num_experts()
        router = self.linear(self._ws(ck, f"{p}.{self.arch.router_name}.weight", (e, self.hidden)), fmt=None)
        shared = gate = None
        if self.arch.shared_expert:
            si = self.hf.req("shared_expert_intermediate_size")
            sp = f"{p}.shared_expert"
            shared = self._gated_mlp(ck, sp, si)
            gate = self._w(ck, f"{p}.shared_expert_gate.weight", (1, self.hidden))
        norm = self.arch.always_norm_topk or bool(self.hf.get("norm_topk_prob", self.arch.norm_topk_default))
        return SparseMoE(self.moe_layers.index(i), router, self.experts, self.top_k(), norm,
                         shared=shared, shared_gate=gate)

    def _load_layer(self, ck: Checkpoint, i: int) -> DecoderLayer:
        p = f"model.layers.{i}"
        attn = Attention(ck, f"{p}.self_attn", self.hf, self.arch, self.linear, self.device, self.rotary,
                         self.sliding_window(i))
        mlp = self._load_moe(ck, i) if i in self.moe_layers else self._load_mlp(ck, i)
        return DecoderLayer(attn, mlp, RMSNorm(self._w(ck, f"{p}.input_layernorm.weight", (self.hidden,)), self.eps),
                            RMSNorm(self._w(ck, f"{p}.post_attention_layernorm.weight", (self.hidden,)), self.eps))

    def decoder_layer(self, ck: Checkpoint, i: int):
        """Decoder layer i read as the class reads its own (a nextn layer stored after the last)."""
        return self._load_layer(ck, i)

    # --- compute -------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        if self.experts is not None:
            self.experts.begin_step(ctx.phase, len(input_ids))
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary.tables(positions)
        if (out := self._stack_row(x, cos, sin, ctx, self.norm)) is not None:
            self.prenorm = out[0]
            return out[1] if out[1] is not None else self.norm(out[0])
        for i, layer in enumerate(self.layers):
            x = layer(i, x, cos, sin, ctx)
        self.prenorm = x            # the last hidden states before the final norm (an MTP drafter's input)
        return self.norm(x)

    def _stack_row(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: ForwardContext, norm):
        """A one-row decode step through every layer (and the final norm, `norm` as a plain
        RMSNorm computes it) in one C call (`DecodeStack`): (the last hidden row, its final norm
        or None), or None (the layers one by one: also the first such step, which builds the
        layers' calls)."""
        if x.shape[0] != 1 or not (STACK[0] and ATTN_HALF[0]):
            return None
        stack = self.decode_stack
        if stack is None or not stack.current(self.layers):
            # (a subclass's own call order unless it says it keeps DecoderLayer's)
            plain = all(isinstance(layer, DecoderLayer) and vars(type(layer)).get("row_stack") for layer in self.layers)
            stack = self.decode_stack = DecodeStack.build(self.layers) if plain else None
        return stack(x, cos, sin, ctx, norm) if stack is not None else None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        return logits if logits.dtype is torch.float32 else logits.float()
