"""The expert pool of a GGUF file, straight from its merged expert tensors
`blk.N.ffn_{gate,up,down}_exps.weight` [E, rows, cols]:
  quantized (every type of quant/ggml_quants.py: Q4_0..Q8_0, Q2_K..Q6_K, IQ4_NL, IQ4_XS, TQ1_0,
      TQ2_0, MXFP4): the "ggml" banks, each output row the file's raw block bytes,
      the type id of every matrix kept beside (gate_up_types [N, 2], down_types [N, 1]);
      layers of different row widths (Q4_K_M's Q6_K / Q4_K ffn_down) go to one pool per widths,
      a `GroupedPool` (experts/grouped_pool.py), and gate and up are banks of their own, so no
      row is padded: the pool is the file's expert bytes plus 12 bytes of type ids per expert;
  F32/F16/BF16: float banks in the engine's dtype (re-encoded with --expert-format if asked).
gpt-oss's expert biases (`ffn_*_exps.bias`) become gate_up_bias / down_bias."""
from __future__ import annotations

import logging

import torch

from ...errors import CheckpointError
from .types import BF16, F16, F32, dequantize
from ...experts.grouped_pool import GroupedPool
from ...experts.memory.pool import ExpertPool, ExpertSpec, requantize
from ...quant import ggml_quants
from .meta import byte_shape

log = logging.getLogger("freetoken.weights")
FLOAT = {F32, F16, BF16}


def layout(types: set[int]) -> str:
    """"float" for float experts; "ggml" when every type present has a dequantizer here (kept
    packed: the C kernels read it, or the torch executor for a type without one); else
    "dequantize" (a type this engine cannot decode at all: float banks at load, with a warning)."""
    if types <= FLOAT:
        return "float"
    return "ggml" if all(t in ggml_quants.NAMES for t in types) else "dequantize"


def expert_tensors(ck, blocks: list[int] | None = None) -> tuple[list[int], list[list]]:
    """(MoE block ids, their [gate, up, down] TensorInfos), shapes checked; `blocks`: those
    blocks (a nextn block's), else the decoder's."""
    blocks = moe_blocks(ck) if blocks is None else blocks
    parts = [[ck.tensor_info(f"blk.{b}.ffn_{p}_exps.weight") for p in ("gate", "up", "down")] for b in blocks]
    for b, trio in zip(blocks, parts):
        if None in trio:
            raise CheckpointError(f"{ck.path}: block {b} has ffn_gate_exps but not all of ffn_up_exps/ffn_down_exps")
    if parts:
        e, inter, hidden = parts[0][0].shape
        want = ((e, inter, hidden), (e, inter, hidden), (e, hidden, inter))
        for b, (g, u, d) in zip(blocks, parts):
            if (g.shape, u.shape, d.shape) != want:
                raise CheckpointError(f"{ck.path}: block {b} expert tensors have shapes {g.shape}, {u.shape}, "
                                      f"{d.shape}, expected {want}")
    return blocks, parts


def moe_blocks(ck) -> list[int]:
    """The decoder's MoE blocks (nextn blocks, numbered after the last decoder layer, are not)."""
    last = ck.config.get("num_hidden_layers")
    return sorted(b for b in (int(n.split(".")[1]) for n in ck.tensors_by_name if n.endswith(".ffn_gate_exps.weight"))
                  if last is None or b < last)


def activation(ck) -> dict:
    """The experts' activation as ExpertSpec fields: gpt-oss's clamped SwiGLU, DeepSeek-V4's
    clamped SiLU gate, else plain SiLU."""
    if ck.arch == "gpt-oss":
        return dict(activation="swiglu_oai", alpha=1.702, limit=7.0)
    if ck.arch == "deepseek4":
        return dict(activation="silu_clamp", limit=ck.config["swiglu_limit"])
    return {}


def build_pool(ck, blocks: list[int] | None = None):
    """The decoder's expert pool (or that of `blocks`: a nextn layer's own bank)."""
    blocks, parts = expert_tensors(ck, blocks)
    if not blocks:
        return None
    e, inter, hidden = parts[0][0].shape
    gpt_oss = ck.arch == "gpt-oss"
    spec_kw = activation(ck)
    kind = layout({t.ggml_type for trio in parts for t in trio})
    n = len(blocks) * e
    if kind == "ggml":
        if ck.expert_format:
            raise CheckpointError(f"{ck.path}: the experts are already quantized by llama.cpp; drop --expert-format")
        return _ggml_pool(ck, blocks, parts, e, ExpertSpec(hidden=hidden, intermediate=inter, fmt="ggml", **spec_kw))
    if kind == "dequantize":
        log.warning("%s: expert types %s cannot be kept packed here: dequantizing the experts to %s at load",
                    ck.path, sorted({t.ggml_type for trio in parts for t in trio} - FLOAT - set(ggml_quants.NAMES)),
                    ck.float_experts_dtype)
    dt = ck.float_experts_dtype
    gate_up = torch.empty((n, 2 * inter, hidden), dtype=dt)
    down = torch.empty((n, hidden, inter), dtype=dt)
    for m, (g, u, d) in enumerate(parts):
        rows = slice(m * e, (m + 1) * e)
        gate_up[rows, :inter] = dequantize(ck.raw(g.name), g.ggml_type, g.shape, owned=True)
        gate_up[rows, inter:] = dequantize(ck.raw(u.name), u.ggml_type, u.shape, owned=True)
        down[rows] = dequantize(ck.raw(d.name), d.ggml_type, d.shape, owned=True)
    banks = {"gate_up": gate_up, "down": down}
    spec = ExpertSpec(hidden=hidden, intermediate=inter, **spec_kw)
    if gpt_oss:
        banks.update(expert_biases(ck, blocks, e, inter, hidden))
    pool = ExpertPool(banks, len(blocks), e, spec)
    return requantize(pool, ck.expert_format) if ck.expert_format and spec.fmt == "float" else pool


def row_widths(parts) -> list[tuple[int, int, int]]:
    """Per MoE layer, (gate, up, down row bytes) of its ggml types."""
    inter, hidden = parts[0][0].shape[1], parts[0][0].shape[2]
    return [tuple(ggml_quants.row_bytes(t.ggml_type, cols) for t, cols in zip(trio, (hidden, hidden, inter)))
            for trio in parts]


def width_groups(parts) -> list[list[int]]:
    """The MoE layers grouped by their row widths (narrowest first), each group's layers ascending."""
    widths = row_widths(parts)
    return [[m for m, w in enumerate(widths) if w == key] for key in sorted(set(widths))]


def _ggml_pool(ck, blocks, parts, e: int, spec):
    """One ExpertPool per group of equal row widths; a GroupedPool when there are several."""
    groups = width_groups(parts)
    biases = expert_biases(ck, blocks, e, spec.intermediate, spec.hidden) if ck.arch == "gpt-oss" else {}
    pools = []
    for layers in groups:
        banks = _ggml_banks(ck, [parts[m] for m in layers], e)
        if biases:
            rows = torch.cat([torch.arange(m * e, (m + 1) * e) for m in layers])
            banks.update({k: b.index_select(0, rows) for k, b in biases.items()})
        pools.append(ExpertPool(banks, len(layers), e, spec))
    return pools[0] if len(pools) == 1 else GroupedPool(pools, groups)


def _ggml_banks(ck, parts, e: int) -> dict[str, torch.Tensor]:
    """Banks of the layers `parts` (gate, up and down each as wide as its widest layer here)."""
    g0, _, d0 = parts[0]
    inter, hidden = g0.shape[1], g0.shape[2]
    widths = [max(w) for w in zip(*row_widths(parts))]
    n = len(parts) * e
    banks = {name: torch.zeros((n, rows, w), dtype=torch.uint8)
             for name, rows, w in zip(("gate", "up", "down"), (inter, inter, hidden), widths)}
    gate_up_types = torch.empty((n, 2), dtype=torch.int32)
    down_types = torch.empty((n, 1), dtype=torch.int32)
    for m, (g, u, d) in enumerate(parts):
        rows = slice(m * e, (m + 1) * e)
        for t, name in ((g, "gate"), (u, "up"), (d, "down")):
            _read_rows(ck, t, banks[name][rows])
        gate_up_types[rows, 0], gate_up_types[rows, 1] = g.ggml_type, u.ggml_type
        down_types[rows, 0] = d.ggml_type
    return {**banks, "gate_up_types": gate_up_types, "down_types": down_types}


def _read_rows(ck, t, dst: torch.Tensor) -> None:
    """Merged expert tensor `t` [E, rows, row_bytes] into bank rows `dst` [E, rows, width >=
    row_bytes], one expert at a time straight from the file (no whole-tensor copy in memory)."""
    r, _ = ck.reader(t.name)
    e, rows, rb = byte_shape(t)
    per = rows * rb
    scratch = None if dst.shape[-1] == rb else torch.empty((rows, rb), dtype=torch.uint8)
    for j in range(e):
        if scratch is None:
            r.tensor_into(dst[j], t.offset + j * per)
        else:                                   # a narrower type in a padded bank
            r.tensor_into(scratch, t.offset + j * per)
            dst[j, :, :rb] = scratch


def expert_biases(ck, blocks, e, inter, hidden) -> dict[str, torch.Tensor]:
    gu, dn = [], []
    for b in blocks:
        got = {}
        for p, cols in (("gate", inter), ("up", inter), ("down", hidden)):
            t = ck.tensor_info(f"blk.{b}.ffn_{p}_exps.bias")
            if t is None or t.shape != (e, cols):
                raise CheckpointError(f"{ck.path}: gpt-oss tensor blk.{b}.ffn_{p}_exps.bias missing "
                                      f"or not [{e}, {cols}]")
            got[p] = dequantize(ck.raw(t.name), t.ggml_type, t.shape).float()
        gu.append(torch.cat([got["gate"], got["up"]], dim=1))
        dn.append(got["down"])
    return {"gate_up_bias": torch.cat(gu), "down_bias": torch.cat(dn)}
