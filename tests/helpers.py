"""Helpers shared by tests (importable as `helpers`: pytest adds tests/ to sys.path)."""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ARCHS = ["qwen3_moe", "qwen2_moe", "mixtral", "olmoe"]
# ../shared/data next to the checkout (found from a git worktree one level deeper too)
SHARED_DATA = next((p / "shared" / "data" for p in Path(__file__).resolve().parents[1:4]
                    if (p / "shared" / "data").is_dir()),
                   Path(__file__).resolve().parents[1].parent / "shared" / "data")


def save_hf_checkpoint(config, out: Path, tokenizer_from: Path, seed: int = 0, max_shard_size=None,
                       random_selection_bias: bool = False) -> Path:
    """A checkpoint made directly by transformers (config class + save_pretrained), with a tokenizer copied in.
    random_selection_bias: give sigmoid routers non-zero correction biases, as real checkpoints have."""
    import transformers
    from freetoken.tiny import randomize_selection_biases
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    if random_selection_bias:
        randomize_selection_biases(model)
    kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, **kw)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tokenizer_from / f, out / f)
    return out


def reference_logits(model_dir: Path, ids: list[int], dtype=torch.float32) -> torch.Tensor:
    import transformers
    ref = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    with torch.no_grad():
        return ref(torch.tensor([ids])).logits[0].float()


def assert_logits_close(ours: torch.Tensor, ref: torch.Tensor, rel: float = 1e-4):
    scale = max(1.0, ref.abs().max().item())
    err = (ours - ref).abs().max().item()
    assert err <= rel * scale, f"max abs logit error {err:.3g} > {rel} x logit scale {scale:.3g}"


@contextlib.contextmanager
def exact_experts():
    """Inside: the torch expert executors (the `resident` backend, the CPU executor's prefill
    split) skip the C kernels' activation rounding (int8 per 32 for int8/mxfp4/nvfp4/ggml, bf16
    under the bf16 dots; experts/execution/numerics.py), i.e. the exact dequantize-then-matmul math a
    transformers reference computes. As served, every tier (resident included) rounds as the C
    kernels do, so it matches such a reference only to the kernels' tolerance."""
    from freetoken.experts.execution import torch_exec
    saved = torch_exec.default_rounding
    torch_exec.default_rounding = lambda banks, spec, dtype, tokens=1: "none"
    try:
        yield
    finally:
        torch_exec.default_rounding = saved


def top2_margin(logits: torch.Tensor) -> torch.Tensor:
    top = torch.topk(logits, 2, dim=-1).values
    return top[..., 0] - top[..., 1]


# ops that need tensor data on the host (a device sync on CUDA)
SYNC_OPS = {"_local_scalar_dense", "item", "is_nonzero", "nonzero", "masked_select", "_unique2", "unique_dim",
            "unique_consecutive", "equal", "allclose", "tolist"}


class CountHostSyncs(TorchDispatchMode):
    """Counts the ops that need tensor data on the host (a device sync on CUDA) and copies to
    the CPU from another device."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name in SYNC_OPS:
            self.ops.append(name)
        if name in ("_to_copy", "copy_") and args and isinstance(args[0], torch.Tensor):
            dst = (kwargs or {}).get("device")
            src = args[1] if name == "copy_" else args[0]
            if (name == "copy_" and args[0].device.type == "cpu" and src.device.type != "cpu") or \
                    (dst is not None and torch.device(dst).type == "cpu" and src.device.type != "cpu"):
                self.ops.append("d2h")
        return func(*args, **(kwargs or {}))


def q8k_act(v: torch.Tensor) -> torch.Tensor:
    """The k-quant dots' per-256 activation rounding (kernels/c/ggml_act.c's ggml_prep256, as
    llama.cpp's Q8_K): int8 q = round(x / d), d = amax / 127 in fp32, half to even; q * d in float64."""
    b = v.float().unflatten(-1, (-1, 256))
    d = b.abs().amax(-1, keepdim=True) / 127.0
    return (torch.round(b * torch.where(d > 0, 1.0 / d, torch.zeros_like(d))) * d).flatten(-2).double()


def paged_mixed_step(g: torch.Generator, hkv: int, d: int, dtype: torch.dtype,
                     seqs: list[tuple[int, int]]) -> tuple:
    """A paged attention step of prefill chunks and decode tokens: `seqs` lists (tokens already
    cached, new tokens) per sequence, over a random KVCache of `dtype` with scattered slots.
    Returns (cache, metadata, new tokens in all)."""
    import torch.nn.functional as F
    from freetoken.layers.attention.paged import AttentionMetadata, KVCache
    cache = KVCache(4096, hkv, d, dtype, "cpu")
    cache.k.copy_(torch.randn(cache.k.shape, generator=g))
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    perm = torch.randperm(4000, generator=g) + 16
    kmax, qmax = max(a + n for a, n in seqs), max(n for _, n in seqs)
    key_slots, slot_map, qidx, qpos, start, off = [], [], [], [], 0, 0
    for a, n in seqs:
        s = perm[start:start + a + n]
        start += a + n
        key_slots.append(F.pad(s, (0, kmax - len(s))))
        slot_map.append(s[a:])
        qidx.append(F.pad(torch.arange(off, off + n), (0, qmax - n), value=sum(n for _, n in seqs)))
        qpos.append(F.pad(torch.arange(a, a + n), (0, qmax - n), value=-1))
        off += n
    ctx = torch.tensor([a + n for a, n in seqs])
    key_pos = torch.where(torch.arange(kmax) < ctx[:, None], torch.arange(kmax), 1 << 40)
    meta = AttentionMetadata(slot_mapping=torch.cat(slot_map), key_slots=torch.stack(key_slots),
                             key_positions=key_pos, query_index=torch.stack(qidx), query_positions=torch.stack(qpos),
                             num_tokens=off, context_lens=ctx)
    return cache, meta, off


def bf16_rounded_attention(q, k, v, key_slots, lens, scale):
    """The decode attention kernels' arithmetic with the bf16 switch on (llama.cpp's for a bf16
    cache), in float64: each row's q rounded to bf16 for the scores, the softmax numerators rounded
    to bf16 before they weigh the values (what vdpbf16ps multiplies), their unrounded sum as the
    denominator. q [rows, Hq, D]; k, v [slots, Hkv, D]; row i reads key_slots[i, :lens[i]]."""
    outs = []
    for i, n in enumerate(lens.tolist()):
        s = key_slots[i, :n]
        keys, values = k[s].double(), v[s].double()                    # [n, Hkv, D]
        g = q.shape[1] // keys.shape[1]
        keys, values = keys.repeat_interleave(g, 1), values.repeat_interleave(g, 1)
        sc = torch.einsum("hd,nhd->hn", q[i].bfloat16().double(), keys) * scale
        e = torch.exp(sc - sc.max(1, keepdim=True).values)
        outs.append(torch.einsum("hn,nhd->hd", e.float().bfloat16().double(), values) / e.sum(1, keepdim=True))
    return torch.stack(outs)


def rss_bytes() -> int:
    """This process's resident set (VmRSS), bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")
