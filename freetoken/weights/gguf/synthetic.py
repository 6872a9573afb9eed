"""Random-weight qwen3moe GGUFs with real shapes (Qwen3-30B-A3B by default), written tensor by
tensor so a 17 GB file needs no more memory than its largest tensor. For benchmarks and
memory tests: the model is random, the shapes, types and file layout are a real download's.

Quantized tensors are random bytes with fixed fp16 scales per block that make every weight
zero-mean, at gains (`gain`) under which the routing spreads over the experts like a real
model's (bench/routing_spread.py); the router weights are Gaussian; the tokenizer keys come
from a real vocabulary GGUF (`ggml-vocab-qwen2.gguf`, the Qwen2/Qwen3 BPE)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .meta import read_header

F32, F16, Q8_0, Q4_K, Q6_K, BF16 = 0, 1, 8, 12, 14, 30
# block scales: a weight's rms ~ 1/sqrt(2048) (Q4_K: rms sc 36.5 x rms(q - 7.5) 4.6; Q6_K: 8 x 18.5)
Q4_K_D, Q6_K_D = 1.3e-4, 1.5e-4


@dataclass(frozen=True)
class Shape:
    layers: int = 48
    hidden: int = 2048
    heads: int = 32
    kv_heads: int = 4
    head_dim: int = 128
    experts: int = 128
    top_k: int = 8
    moe_inter: int = 768
    vocab: int | None = None        # None: the tokenizer's vocabulary size


QWEN3_30B_A3B = Shape()


def q4_k_m_type(name: str, layer: int) -> int:
    """llama.cpp's Q4_K_M mix as real files have it: Q6_K for attn_v, output and ffn_down of
    every other layer; Q4_K for every other 2-D weight (experts included)."""
    if name == "output" or name == "attn_v" or (name.startswith("ffn_down") and layer % 2 == 0):
        return Q6_K
    return Q4_K


def _block(ty: int) -> tuple[int, int]:
    import gguf
    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ty)]


def _scale_fields(ty: int, nblocks: int, blob: np.ndarray, gain: float = 1.0) -> None:
    """Overwrite the per-block scales of random `blob` [nblocks, block_bytes] in place so every
    weight is zero-mean with an rms near 1/sqrt(2048) (times `gain`, Q4_K). Random bytes as
    scales would give every value a positive mean (Q4_K: d*sc*q - dmin*m, q in 0..15): every
    matrix is then mostly c * ones * ones^T, each layer's output points along the ones
    direction whatever the token, and every token routes to the same experts
    (docs/benchmarks.md, "Routing spread")."""
    if ty == Q4_K:                     # d, dmin, scales[12], qs[128]
        blob[:, 0:2] = np.array([Q4_K_D * gain], dtype=np.float16).view(np.uint8)
        blob[:, 2:4] = np.array([7.5 * Q4_K_D * gain], dtype=np.float16).view(np.uint8)
        # the 6-bit scale and min of each sub-block equal (scale bytes 4..7 = 0..3, each of 8..11
        # its low nibble twice: ggml's get_scale_min_k4): a value is sc * d * (q - 7.5)
        blob[:, 8:12] = blob[:, 4:8]
        blob[:, 12:16] = (blob[:, 12:16] & 0x0F) * np.uint8(0x11)
    elif ty == Q6_K:                   # ql[128], qh[64], scales[16] (int8), d: q - 32 in -32..31
        blob[:, 192:208] = np.where(blob[:, 192:208] & 1, np.uint8(8), np.uint8(256 - 8))   # +-8, random signs
        blob[:, 208:210] = np.array([Q6_K_D], dtype=np.float16).view(np.uint8)
    elif ty == Q8_0:                   # d, qs[32] (int8, symmetric already)
        blob[:, 0:2] = np.array([2e-3], dtype=np.float16).view(np.uint8)


def gain(name: str) -> float:
    """A tensor's scale over the 1/sqrt(2048) rms, chosen so the routing spreads over a layer's
    experts the way a real model's does (bench/routing_spread.py against the Qwen3-30B-A3B
    trace; docs/benchmarks.md, "Routing spread"): token embeddings 30x, so a position's
    own token shows in its hidden state, and attention outputs 1.4/(l+1)^0.75, so what the
    context shares (attention's average) neither drowns the token nor vanishes at depth."""
    if name.startswith("token_embd."):
        return 30.0
    if name.endswith(".attn_output.weight"):
        return 1.4 / (int(name.split(".")[1]) + 1) ** 0.75
    return 1.0


def random_tensor(rng: np.random.Generator, shape: tuple[int, ...], ty: int, gain: float = 1.0) -> np.ndarray:
    """Bytes of a random tensor of numpy-order `shape` in ggml type `ty` (u8 [..., row_bytes]
    for quantized types, floats otherwise); `gain` scales a Q4_K tensor's rms."""
    if ty == F32:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
    if ty in (F16, BF16):
        x = (rng.standard_normal(shape, dtype=np.float32) * 0.02)
        if ty == F16:
            return x.astype(np.float16)
        return (x.view(np.uint32) >> 16).astype(np.uint16)
    block, size = _block(ty)
    nblocks = int(np.prod(shape)) // block
    blob = rng.integers(0, 256, (nblocks, size), dtype=np.uint8)
    _scale_fields(ty, nblocks, blob, gain)
    return blob.reshape(*shape[:-1], shape[-1] // block * size)


def _tokenizer_keys(vocab_gguf: Path) -> list[tuple[str, object, object, object]]:
    """(key, value, type, sub type) of the vocabulary file's `tokenizer.*` keys (our fast header
    reader: gguf.GGUFReader takes ~25 s over a 150k-token vocabulary)."""
    from gguf import GGUFValueType as T

    out = []
    for key, v in read_header(vocab_gguf, tensors=False, keys="tokenizer.").fields.items():
        if not key.startswith("tokenizer."):
            continue
        if isinstance(v, list):
            sub = T.STRING if v and isinstance(v[0], str) else T.FLOAT32 if v and isinstance(v[0], float) else T.INT32
            out.append((key, v, T.ARRAY, sub))
        else:
            vt = T.BOOL if isinstance(v, bool) else T.STRING if isinstance(v, str) else T.UINT32
            out.append((key, v, vt, None))
    return out


def tensor_plan(s: Shape, vocab: int, expert_type=q4_k_m_type, dense_type=q4_k_m_type):
    """[(gguf name, numpy-order shape, ggml type)] of the whole file, in write order."""
    out = [("token_embd.weight", (vocab, s.hidden), dense_type("token_embd", 0))]
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    for i in range(s.layers):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (s.hidden,), F32), (b + "ffn_norm.weight", (s.hidden,), F32),
                (b + "attn_q_norm.weight", (s.head_dim,), F32), (b + "attn_k_norm.weight", (s.head_dim,), F32),
                (b + "attn_q.weight", (q, s.hidden), dense_type("attn_q", i)),
                (b + "attn_k.weight", (kv, s.hidden), dense_type("attn_k", i)),
                (b + "attn_v.weight", (kv, s.hidden), dense_type("attn_v", i)),
                (b + "attn_output.weight", (s.hidden, q), dense_type("attn_output", i)),
                (b + "ffn_gate_inp.weight", (s.experts, s.hidden), F32),
                (b + "ffn_gate_exps.weight", (s.experts, s.moe_inter, s.hidden), expert_type("ffn_gate_exps", i)),
                (b + "ffn_up_exps.weight", (s.experts, s.moe_inter, s.hidden), expert_type("ffn_up_exps", i)),
                (b + "ffn_down_exps.weight", (s.experts, s.hidden, s.moe_inter), expert_type("ffn_down_exps", i))]
    out += [("output_norm.weight", (s.hidden,), F32), ("output.weight", (vocab, s.hidden), dense_type("output", 0))]
    return out


def write(path: str | Path, s: Shape = QWEN3_30B_A3B, vocab_gguf: str | Path | None = None,
          expert_type=q4_k_m_type, dense_type=q4_k_m_type, seed: int = 0, progress=None) -> Path:
    """Writes the GGUF to `path` tensor by tensor; `progress(nbytes)` after each tensor."""
    import gguf
    path = Path(path)
    vocab_gguf = Path(vocab_gguf or default_vocab())
    keys = _tokenizer_keys(vocab_gguf)
    vocab = s.vocab or len(next(v for k, v, _, _ in keys if k == "tokenizer.ggml.tokens"))
    plan = tensor_plan(s, vocab, expert_type, dense_type)
    w = gguf.GGUFWriter(path, "qwen3moe")
    w.add_name("synthetic-qwen3moe")
    w.add_block_count(s.layers)
    w.add_context_length(40960)
    w.add_embedding_length(s.hidden)
    w.add_feed_forward_length(6144)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(s.experts)
    w.add_expert_used_count(s.top_k)
    w.add_expert_feed_forward_length(s.moe_inter)
    for key, val, vt, sub in keys:
        if key == "tokenizer.ggml.tokens" and s.vocab and s.vocab != len(val):
            raise ValueError(f"vocab {s.vocab} != the tokenizer's {len(val)} tokens")
        w.add_key_value(key, val, vt, sub_type=sub)
    for name, shape, ty in plan:
        block, size = _block(ty)
        nbytes = int(np.prod(shape[:-1])) * (shape[-1] // block) * size
        quant = ty not in (F32, F16, BF16)     # the writer takes byte shapes for quantized types
        dt = np.float32 if ty == F32 else np.uint8 if quant else np.float16
        w.add_tensor_info(name, (*shape[:-1], shape[-1] // block * size) if quant else shape, np.dtype(dt),
                          nbytes, raw_dtype=gguf.GGMLQuantizationType(ty))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, shape, ty in plan:
        data = random_tensor(rng, shape, ty, gain(name))
        if name.endswith("norm.weight"):
            data = np.ones(shape, dtype=np.float32)
        w.write_tensor_data(data)
        if progress is not None:
            progress(data.nbytes)
        del data
    w.close()
    return path


def default_vocab() -> Path:
    repo = next(p for p in Path(__file__).resolve().parents if p.name == "freetoken").parent   # wherever this file sits
    for root in (repo.parent / "shared", repo / "shared", Path("/work/shared")):
        p = root / "data" / "tokenizers" / "ggml-vocab-qwen2.gguf"
        if p.is_file():
            return p
    raise FileNotFoundError("ggml-vocab-qwen2.gguf not found (expected under shared/data/tokenizers/)")
