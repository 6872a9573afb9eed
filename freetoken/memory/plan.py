"""One memory plan, made once at start: what each device holds (weights, expert cache slots,
KV blocks, per-sequence states, activations) from the model's sizes, the options and the
memory the machine has free. Asked-for sizes that cannot fit are reduced in this order, one
warning line each, and boot goes on:

  1. expert cache slots   (speed only: misses are filled or run on the CPU), then the
     state-checkpoint budget of hybrid models (prefix reuse: speed only)
  2. KV pool              (down to one sequence of max_model_len tokens)
  3. prefill chunk        (max_num_batched_tokens, halved down to 256: activations)
  4. max_model_len        (down to what the remaining KV pool holds)

The ladder is data (`LADDER`: one `Component` a rung, whether it may shrink and how) walked
once by `fit`; `make_plan` weighs the weights, takes the asked sizes, fits them and hands the
result to `_report`, which writes the table's rows apart from the arithmetic.
Weights themselves are never reduced: when they alone do not fit, the plan says so (one
warning) and boots anyway. `make_plan` returns the `Settings` (config.py) in blocks and slots
(max_model_len, kv_blocks, expert cache and host cache slots, prefill chunk, backend,
state-checkpoint budget) and the plan that explains them; `memory/resolve.py` is its front
door. Everything is sized from this one decision; defaults come from `freetoken/defaults.py`."""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Callable

from .. import defaults
from ..config import EngineConfig, Settings, activation_dtype_for, spin_us
from ..experts.memory.slots import DEFAULT_POLICY
from ..models.cache_spec import CacheSpec, cache_spec_for
from ..models.hf_config import HFConfig
from ..loading.experts_backend import cache_choice
from ..models.registry import model_class
from .model_size import ModelShape
from .probe import GiB, MachineMemory
from ..experts.disk.plan import disk_tier
from ..experts.memory import pinning

log = logging.getLogger("freetoken.memory")

DEVICE_HEADROOM = int(defaults.DEVICE_HEADROOM_GIB * GiB)


def host_headroom(m: MachineMemory, cfg: EngineConfig | None = None) -> int:
    """Host memory left to the OS and other programs: `memory_headroom_gib`, by default
    max(10% of host memory, 2 GiB) (defaults.HOST_HEADROOM_*)."""
    if cfg is not None and cfg.memory_headroom_gib is not None:
        return int(cfg.memory_headroom_gib * GiB)
    return max(int(defaults.HOST_HEADROOM_GIB * GiB), m.host_total // defaults.HOST_HEADROOM_DIVISOR)


def host_budget(m: MachineMemory, cfg: EngineConfig | None = None) -> int:
    """What the plan may fill on the host: host memory (or the cgroup limit) less the headroom.
    A fixed number for a machine and its options, so the sizes chosen from it (prefill chunk,
    max_model_len, caches) are the same at every launch whatever happens to be free then."""
    return max(0, m.host_total - host_headroom(m, cfg))


@dataclass
class Item:
    device: str
    name: str
    nbytes: int
    asked: int | None = None       # what the options asked for, when the plan reduced it
    note: str = ""


@dataclass
class MemoryPlan:
    items: list[Item] = field(default_factory=list)
    available: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    options: dict = field(default_factory=dict)     # the sizes and choices it resolved (Settings fields)
    host_source: str = ""
    pinned: int = 0                # host bytes page-locked (CUDA: the expert pool in place, whole pages;
                                   # state checkpoints in the pinned allocator's power-of-two blocks)
    kv_blocks: int = 0             # KV blocks to allocate, the null block included (0: no plan made)

    def used(self, device: str) -> int:
        return sum(i.nbytes for i in self.items if i.device == device)

    def to_json(self) -> dict:
        return {"devices": {d: {"available": a, "planned": self.used(d)} for d, a in self.available.items()},
                "items": [dataclasses.asdict(i) for i in self.items], "warnings": self.warnings,
                "options": self.options, "host_available_from": self.host_source, "pinned_bytes": self.pinned}

    def table(self) -> str:
        rows = [f"{'device':<7}{'component':<24}{'GiB':>10}  note"]
        for i in self.items:
            asked = f" (asked {i.asked / GiB:.3f})" if i.asked is not None else ""
            rows.append(f"{i.device:<7}{i.name:<24}{i.nbytes / GiB:>10.3f}  {i.note}{asked}")
        for d, a in self.available.items():
            rows.append(f"{d:<7}{'= planned / available':<24}{self.used(d) / GiB:>10.3f}  of {a / GiB:.3f} GiB"
                        + (f" ({self.host_source})" if d == "host" else ""))
        if self.pinned:
            rows.append(f"{'host':<7}{'pinned (in place)':<24}{self.pinned / GiB:>10.3f}  page-locked where it lies "
                        "(the expert pool: cudaHostRegister, whole pages; state checkpoints: pinned blocks): "
                        "no copy, counted above")
        return "\n".join(rows)


# --- sizes from the config -------------------------------------------------------------------
def _dtype_bytes(name: str) -> int:
    return 4 if name in ("float32", "fp32") else 2


def moe_layer_count(s: ModelShape) -> int:
    layers = s.get("num_hidden_layers", default=0)
    if not s.get("num_experts", "num_local_experts", "n_routed_experts", default=0):
        return 0
    step = s.get("decoder_sparse_step", default=1) or 1
    dense_first = s.get("first_k_dense_replace", default=0)
    only = set(s.get("mlp_only_layers", default=[]) or [])
    return sum(1 for i in range(layers) if i not in only and (i + 1) % step == 0 and i >= dense_first)


def expert_format(s: ModelShape, cfg: EngineConfig) -> str:
    if s.native_expert_format.startswith("prebuilt:"):
        return s.native_expert_format
    if s.native_expert_format != "float":
        return s.native_expert_format
    if cfg.expert_format:
        return cfg.expert_format
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(cfg.dtype, "bf16")


def expert_nbytes(s: ModelShape, fmt: str) -> int:
    """Bytes of one expert across all banks of the pool (matches ExpertPool.expert_nbytes): the
    format's weights, plus what the model class adds (`expert_extra_bytes`: gpt-oss's biases)."""
    if s.prebuilt_expert_bytes is not None:
        return s.prebuilt_expert_bytes
    h = s.get("hidden_size")
    i = s.get("moe_intermediate_size", "intermediate_size")
    w = 3 * h * i
    if fmt in ("fp32", "bf16", "fp16"):
        n = w * (4 if fmt == "fp32" else 2)
    elif fmt == "int8":
        n = w + (w // 32) * 2
    elif fmt == "mxfp4":
        n = w // 2 + w // 32
    elif fmt == "ggml":                           # requantized float experts: Q8_0 (GGUFs: prebuilt bytes)
        n = w // 32 * 34 + 3 * 4
    elif fmt == "fp8":
        c = lambda x: -(-x // 128)  # noqa: E731
        n = w + 4 * (c(2 * i) * c(h) + c(h) * c(i))
    else:
        raise ValueError(f"unknown expert format {fmt!r}")
    cls, hf = model_of(s)
    return n + cls.expert_extra_bytes(hf)


def model_of(s: ModelShape) -> tuple[type, HFConfig]:
    """The model class the config names and its text config, as `cache_spec_for` resolves them:
    the class answers what it keeps beyond the sizes read here."""
    cls = model_class(s.config, "config.json")
    return cls, HFConfig(cls.text_config(s.config), "config.json")


def _attn(s: ModelShape):
    heads = s.get("num_attention_heads")
    kvh = s.get("num_key_value_heads", default=heads)
    hd = s.get("head_dim", default=s.get("hidden_size") // heads)
    return heads, kvh, hd


def cache_spec(s: ModelShape, cfg: EngineConfig, max_len: int) -> CacheSpec:
    """What the model class allocates per token and per sequence (models/cache_spec.py), with
    the activation dtype the engine will pick (the states that keep activations use it)."""
    return cache_spec_for(s.config, "config.json", max_len, cfg.torch_dtype, cfg.torch_device, cfg.compute_dtype)


def kv_bytes_per_token(s: ModelShape, cfg: EngineConfig) -> int:
    return cache_spec(s, cfg, 1).kv_bytes_per_token


def state_bytes_per_seq(s: ModelShape, cfg: EngineConfig, max_len: int = 1) -> int:
    """Recurrent, sliding-window and compressed states one sequence of max_len tokens carries."""
    return cache_spec(s, cfg, max_len).state_bytes


def activation_bytes(s: ModelShape, cfg: EngineConfig, chunk: int, max_len: int, device: str) -> int:
    """Estimate for one step of `chunk` tokens: hidden states, q/k/v, MLP and routed-expert
    intermediates and per-choice expert outputs in fp32, the prefill mask against the whole context, logits, the rope tables
    of max_len positions; on CUDA also the keys/values gathered for every decoding sequence
    (`gathered_kv_bytes`)."""
    heads, kvh, hd = _attn(s)
    h = s.get("hidden_size")
    inter = max(s.get("intermediate_size", default=0) or 0,
                s.get("num_experts_per_tok", default=0) * (s.get("moe_intermediate_size", default=0) or 0))
    k = s.get("num_experts_per_tok", default=0) or 0
    # + one fp32 row per routed choice: the tiered backends sum a token's choices in a fixed order
    per_token = 6 * h + 2 * heads * hd + 2 * kvh * hd + 3 * inter + k * h
    n = 4 * chunk * per_token + 4 * chunk * max_len + 8 * cfg.max_num_seqs * s.get("vocab_size")
    n += 4 * 4 * max_len * hd                     # rope cos/sin tables for every position (+ build temporaries)
    if device == "cuda":
        n += gathered_kv_bytes(s, cfg, max_len)
    return n


def dense_bytes(s: ModelShape, cfg: EngineConfig) -> int:
    params, fixed = s.dense_params, 0
    if cfg.dense_format != "float" and cfg.torch_device.type == "cpu":   # GGUF rows kept packed
        params, fixed = params - s.packed_dense[0], s.packed_dense[1]
    if cfg.dense_format == "int8":
        return params * 34 // 32 + fixed
    return params * _dtype_bytes(cfg.dtype) + fixed


# --- what CUDA adds: gathered KV, pinned bytes and their rounding ------------------------------
def gathered_kv_bytes(s: ModelShape, cfg: EngineConfig, max_len: int) -> int:
    """Device bytes one attention layer materialises when it gathers every decoding sequence's
    keys for a whole context (layers/attention/paged.gather: the cache rows, plus a copy in the compute
    dtype when the KV dtype differs). CUDA attention reads the paged cache in place
    (paged_flex.py); the gather is its fallback when the fused kernel cannot run, and DSA's
    indexer always gathers its fp32 keys (dsa.py). The values per token are the model class's
    (`gathered_values`). Budgeted, so the fallback does not run the device out of memory."""
    rows = cfg.max_num_seqs * max_len
    kv_b = _dtype_bytes(cfg.dtype)
    comp_b = kv_b if cfg.compute_dtype == "auto" else _dtype_bytes(cfg.compute_dtype)
    copies = kv_b + (comp_b if comp_b != kv_b else 0)
    cls, hf = model_of(s)
    values, fp32_values = cls.gathered_values(hf)     # fp32 ones: gathered in the KV dtype, then converted
    return rows * (values * copies + fp32_values * (kv_b + 4))


def snapshot_parts(s: ModelShape, cfg: EngineConfig) -> tuple[int, ...]:
    """Bytes of each host buffer one state snapshot takes (one per state part; the model class's
    cache_spec)."""
    return cache_spec(s, cfg, 1).snapshot_parts


def pinned_snapshot_bytes(s: ModelShape, cfg: EngineConfig) -> tuple[int, int]:
    """(bytes one snapshot holds, the pinned host bytes it takes on CUDA): each part's buffer is
    one block of PyTorch's caching host allocator (layers/host_copy.py), a power of two."""
    parts = snapshot_parts(s, cfg)
    return sum(parts), sum(pinning.caching_host_block(p) for p in parts)


def pinned_checkpoint_bytes(budget: int, s: ModelShape, cfg: EngineConfig) -> int:
    """Host bytes a CUDA engine's state checkpoints take for a `budget` of snapshot bytes."""
    each, block = pinned_snapshot_bytes(s, cfg)
    return budget // each * block if each and budget else 0


# --- the KV pool -------------------------------------------------------------------------------
def kv_tokens_asked(cfg: EngineConfig, max_len: int, per_token: int) -> int:
    """Tokens the options ask the KV pool for: max_num_seqs sequences of max_len, capped by
    kv_cache_gib (defaults.KV_CACHE_GIB when not set) at per_token bytes a token."""
    gib = cfg.kv_cache_gib if cfg.kv_cache_gib is not None else defaults.KV_CACHE_GIB
    return min(cfg.max_num_seqs * max_len, kv_tokens_in(gib, per_token))


def kv_tokens_in(gib: float, per_token: int) -> int:
    """Tokens `gib` GiB of KV holds at per_token bytes a token (the simulator sizes its pool so)."""
    return int(gib * GiB / max(1, per_token))


def kv_block_count(tokens: int, block_size: int) -> int:
    """Blocks holding `tokens`, plus block 0, the null block padded reads point at."""
    return -(-tokens // block_size) + 1


# --- the plan ----------------------------------------------------------------------------------
@dataclass
class Sizes:
    """What the plan sizes and may reduce, in their units; `asked` keeps what the options asked."""
    backend: str
    slots: int              # expert cache slots
    ckpt: int               # state-checkpoint budget, bytes
    kv_tokens: int
    chunk: int              # prefill chunk (max_num_batched_tokens)
    max_len: int
    states: int = 0         # per-sequence states of max_num_seqs sequences, bytes
    act: int = 0            # activations of one step, bytes


@dataclass
class Budget:
    """The fixed facts the sizes are weighed against: the compute device's room after the
    weights, and the bytes each size costs."""
    cfg: EngineConfig
    s: ModelShape
    dev: str
    compute: str
    room: int               # compute-device bytes left after the weights (may be < 0)
    expert_bytes: int       # S: one expert, all banks
    n_experts: int
    pool: int
    kv_tok_bytes: int
    auto_ckpt: bool         # no state_cache_gib given: the default shrinks without a warning

    @property
    def bs(self) -> int:
        return self.cfg.kv_block_size

    def kv_bytes(self, tokens: int) -> int:
        return kv_block_count(tokens, self.bs) * self.bs * self.kv_tok_bytes

    def states(self, max_len: int) -> int:
        return state_bytes_per_seq(self.s, self.cfg, max_len) * self.cfg.max_num_seqs

    def act(self, chunk: int, max_len: int) -> int:
        return activation_bytes(self.s, self.cfg, chunk, max_len, self.dev)

    def pinned_ckpt(self, budget: int) -> int:
        """Host bytes `budget` of snapshots take (CUDA: pinned, rounded blocks)."""
        return pinned_checkpoint_bytes(budget, self.s, self.cfg) if self.dev == "cuda" else budget

    def over(self, z: Sizes) -> int:
        """Bytes the sizes need beyond the room (> 0: something must shrink)."""
        host_ckpt = z.ckpt if self.compute == "host" else 0
        return z.slots * self.expert_bytes + host_ckpt + self.kv_bytes(z.kv_tokens) + z.states + z.act \
            - max(0, self.room)


@dataclass(frozen=True)
class Component:
    """One rung of the shrink ladder: the component the options sized, whether it may still
    shrink (above its minimum, and what applies here), and how: `shrink` reduces the sizes in
    place by what is over and returns its warning line (None: a silent default)."""
    name: str
    may_shrink: Callable[[Budget, Sizes, int], bool]
    shrink: Callable[[Budget, Sizes, int], str | None]


def _shrink_cache(b: Budget, z: Sizes, over: int) -> str:
    S, n = b.expert_bytes, b.n_experts
    least = 0 if z.backend == "cpu" else min(n, b.s.get("num_experts_per_tok", default=1))
    new = max(least, z.slots - -(-over // max(S, 1)))
    if z.backend == "resident":
        z.backend, z.slots = "hybrid", new
        return (f"expert cache: the whole pool ({b.pool / GiB:.2f} GiB) does not fit on {b.compute}; "
                f"moe_backend hybrid with {new} of {n} experts cached")
    line = (f"expert cache: {z.slots} slots ({z.slots * S / GiB:.2f} GiB) do not fit; reduced to {new} slots "
            f"({new * S / GiB:.2f} GiB)")
    z.slots = new
    return line


def _shrink_ckpt(b: Budget, z: Sizes, over: int) -> str | None:
    new = max(0, z.ckpt - over)
    line = None if b.auto_ckpt else \
        f"state checkpoints: {z.ckpt / GiB:.2f} GiB do not fit; reduced to {new / GiB:.2f} GiB"
    z.ckpt = new
    return line


def _shrink_kv(b: Budget, z: Sizes, over: int) -> str:
    new = max(z.max_len, z.kv_tokens - -(-over // max(1, b.kv_tok_bytes)))
    line = (f"KV cache: {z.kv_tokens} tokens ({b.kv_bytes(z.kv_tokens) / GiB:.2f} GiB) do not fit; reduced to "
            f"{new} tokens ({b.kv_bytes(new) / GiB:.2f} GiB)")
    z.kv_tokens = new
    return line


def _shrink_chunk(b: Budget, z: Sizes, over: int) -> str:
    old = z.chunk
    while b.over(z) > 0 and z.chunk > defaults.MIN_PREFILL_CHUNK:
        z.chunk = max(defaults.MIN_PREFILL_CHUNK, z.chunk // 2)
        z.act = b.act(z.chunk, z.max_len)
    return f"prefill chunk: max_num_batched_tokens {old} reduced to {z.chunk} (activations {z.act / GiB:.2f} GiB)"


def _max_len_shrinks(b: Budget, z: Sizes, over: int) -> bool:
    return (over <= 0 and z.kv_tokens < z.max_len                  # an explicitly small kv_cache_gib
            or over > 0 and z.kv_tokens > 2 * b.bs and b.kv_tok_bytes > 0)


def _shrink_max_len(b: Budget, z: Sizes, over: int) -> str:
    """The longest max_model_len the KV pool asked for holds, or (still over) the longest whose
    one sequence's KV pool and activations fit."""
    if over <= 0:
        new = max(2 * b.bs, z.kv_tokens)
        line = f"max_model_len: {z.max_len} reduced to {new} (the KV pool asked for holds {z.kv_tokens} tokens)"
        z.max_len, z.kv_tokens = new, max(z.kv_tokens, new)
    else:
        def fits(n: int) -> bool:
            return z.slots * b.expert_bytes + b.kv_bytes(n) + z.states + b.act(min(z.chunk, n), n) <= max(0, b.room)
        lo, hi = 2 * b.bs, min(z.max_len, z.kv_tokens)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
        line = f"max_model_len: {z.max_len} reduced to {lo} (KV pool and activations for one sequence of that length)"
        z.kv_tokens = z.max_len = lo
    z.states = b.states(z.max_len)
    z.chunk = min(z.chunk, z.max_len)
    z.act = b.act(z.chunk, z.max_len)
    return line


# Asked-for sizes that do not fit are reduced in this order (the module docstring says why).
LADDER = (
    Component("expert cache", lambda b, z, over: over > 0 and z.slots * b.expert_bytes > 0, _shrink_cache),
    Component("state checkpoints", lambda b, z, over: over > 0 and z.ckpt > 0 and b.compute == "host", _shrink_ckpt),
    Component("KV cache", lambda b, z, over: over > 0 and z.kv_tokens > z.max_len and b.kv_tok_bytes > 0, _shrink_kv),
    Component("prefill chunk", lambda b, z, over: over > 0 and z.chunk > defaults.MIN_PREFILL_CHUNK, _shrink_chunk),
    Component("max_model_len", _max_len_shrinks, _shrink_max_len),
)


def fit(b: Budget, z: Sizes) -> list[str]:
    """Walk the ladder once: each component that may shrink does, by what is over then."""
    lines = []
    for c in LADDER:
        over = b.over(z)
        if c.may_shrink(b, z, over):
            line = c.shrink(b, z, over)
            lines += [line] if line else []
    return lines


def _weights(cfg: EngineConfig, s: ModelShape, m: MachineMemory, plan: MemoryPlan, dev: str, compute: str):
    """The weights' items (never reduced) and their warnings; returns (n_experts, S, fmt, pool,
    dense, tier, fixed bytes on the compute device)."""
    warn, host_avail = plan.warnings.append, plan.available["host"]
    n_experts = moe_layer_count(s) * s.get("num_experts", "num_local_experts", "n_routed_experts", default=0)
    fmt = expert_format(s, cfg)
    S = expert_nbytes(s, fmt.removeprefix("prebuilt:")) if n_experts else 0
    pool = s.prebuilt_pool_bytes if n_experts and s.prebuilt_pool_bytes is not None else n_experts * S
    dense = dense_bytes(s, cfg)
    tier = disk_tier(cfg, n_experts, moe_layer_count(s), S, pool, dense if compute == "host" else 0, host_avail,
                     m.host_total or None, m.total_source)
    plan.items.append(Item("disk" if tier else "host", "expert pool", pool,
                           note=f"{n_experts} experts x {S / 2**20:.2f} MiB ({fmt})"))
    plan.items.append(Item(compute, "dense weights", dense, note="attention, dense MLPs, embeddings, lm_head"))
    if tier:
        plan.items.append(Item("host", "host expert cache", tier.nbytes,
                               note=f"{tier.slots} experts, read from the model file (disk tier)"))
        plan.warnings += [tier.line] if tier.line else []
    fixed = (tier.nbytes if tier else pool) + dense if compute == "host" else dense
    if dense > plan.available[compute]:
        warn(f"{compute}: this machine cannot hold even the non-expert weights: they need {dense / GiB:.2f} GiB "
             f"(plus {pool / GiB:.2f} GiB of experts) but the budget is {plan.available[compute] / GiB:.2f} GiB")
    if dev == "cuda" and pool > host_avail:
        warn(f"host: the expert pool needs {pool / GiB:.2f} GiB but {host_avail / GiB:.2f} GiB is free "
             "after the headroom; booting anyway (expect swapping or an OOM kill)")
    return n_experts, S, fmt, pool, dense, tier, fixed


def _asked(cfg: EngineConfig, s: ModelShape, b: Budget, tier, fixed: int, budget: int, plan: MemoryPlan) -> Sizes:
    """The sizes the options ask for, before the ladder; checkpoints that cannot fit in host
    memory beside a device engine's pool are cut here (they never compete for device room)."""
    max_len = cfg.max_model_len or defaults.max_model_len(s.get("max_position_embeddings", default=None))
    experts_per_layer = s.get("num_experts", "num_local_experts", "n_routed_experts", default=0)
    # the disk tier runs every routed expert on the CPU from its host cache: no device cache
    backend, slots = ("cpu", 0) if tier else \
        cache_choice(cfg, b.dev, b.n_experts, b.expert_bytes, experts_per_layer, budget - fixed)
    states = b.states(max_len)
    z = Sizes(backend, slots, cfg.state_cache_bytes if states and cfg.prefix_cache else 0,
              kv_tokens_asked(cfg, max_len, max(1, b.kv_tok_bytes)), cfg.max_num_batched_tokens, max_len,
              states, b.act(cfg.max_num_batched_tokens, max_len))
    host_avail = plan.available["host"]
    if b.compute != "host" and z.ckpt and b.pool + b.pinned_ckpt(z.ckpt) > host_avail:
        new = max(0, host_avail - b.pool)
        each, block = pinned_snapshot_bytes(s, cfg)
        if b.dev == "cuda" and each:                  # whole snapshots, each in its rounded blocks
            new = new // block * each
        if not b.auto_ckpt:
            plan.warnings.append(f"state checkpoints: {z.ckpt / GiB:.2f} GiB do not fit in host memory; "
                                 f"reduced to {new / GiB:.2f} GiB")
        z.ckpt = new
    return z


def make_plan(cfg: EngineConfig, s: ModelShape, m: MachineMemory) -> tuple[Settings, MemoryPlan]:
    """The settings for this model shape on this machine, and the plan that explains them:
    the weights, the sizes the options ask for, the ladder fitted to the room, the report."""
    dev = cfg.torch_device.type
    plan = MemoryPlan(host_source=f"host memory {m.host_total / GiB:.2f} GiB less headroom "
                                  f"{host_headroom(m, cfg) / GiB:.2f} GiB")
    plan.available["host"] = host_budget(m, cfg)
    if dev == "cuda":
        plan.available["cuda"] = max(0, (m.device_free or 0) - DEVICE_HEADROOM)
    compute = dev if dev == "cuda" else "host"
    budget = plan.available[compute]
    n_experts, S, _, pool, dense, tier, fixed = _weights(cfg, s, m, plan, dev, compute)
    b = Budget(cfg, s, dev, compute, budget - fixed, S, n_experts, pool, kv_bytes_per_token(s, cfg),
               cfg.state_cache_gib is None)
    if b.room < 0 and dense <= budget:
        plan.warnings.append(f"{compute}: the weights alone need {fixed / GiB:.2f} GiB but {budget / GiB:.2f} GiB "
                             "is free; booting with minimum sizes (expect swapping or an OOM kill)")
    asked = _asked(cfg, s, b, tier, fixed, budget, plan)
    z = dataclasses.replace(asked)
    plan.warnings += fit(b, z)
    if b.over(z) > 0 and b.room >= 0:
        plan.warnings.append(f"{compute}: even at minimum sizes the plan needs {b.over(z) / GiB:.2f} GiB more than "
                             "is free; booting anyway")
    sizes = _report(plan, b, asked, z, tier, m)
    settings = Settings(device=cfg.torch_device, dtype=cfg.torch_dtype, compute_dtype=activation_dtype_for(cfg),
                        num_threads=cfg.num_threads, spin_us=spin_us(), max_num_seqs=cfg.max_num_seqs,
                        prefix_cache=cfg.prefix_cache, plan=plan, **sizes)
    return settings, plan


def _report(plan: MemoryPlan, b: Budget, asked: Sizes, z: Sizes, tier, m: MachineMemory) -> dict:
    """The plan's rows for the sizes chosen (what was asked beside what was reduced), its pinned
    bytes and notes; returns the Settings fields."""
    cfg, compute, dev, bs, S = b.cfg, b.compute, b.dev, b.bs, b.expert_bytes
    warn = plan.warnings.append
    kv, asked_kv = b.kv_bytes(z.kv_tokens), b.kv_bytes(asked.kv_tokens)
    if (z.kv_tokens < cfg.max_num_seqs * asked.max_len and cfg.kv_cache_gib is None
            and z.kv_tokens == kv_tokens_asked(cfg, z.max_len, max(1, b.kv_tok_bytes))):
        kv_note = f"{z.kv_tokens} tokens (default cap {defaults.KV_CACHE_GIB:g} GiB)"
    else:
        kv_note = f"{z.kv_tokens} tokens = {z.kv_tokens // max(1, z.max_len)} x max_model_len {z.max_len}"
    plan.items.append(Item(compute, "KV cache", kv, asked_kv if kv < asked_kv else None,
                           f"{-(-z.kv_tokens // bs)} blocks x {bs} (+1 null block); {kv_note}"))
    cache = z.slots * S
    if cache or z.backend in ("offload", "hybrid"):
        plan.items.append(Item(compute, "expert cache", cache, asked.slots * S if z.slots < asked.slots else None,
                               f"{z.slots} slots, moe_backend {z.backend}"))
    with_ckpt = bool(z.states and cfg.prefix_cache)
    if z.states:
        plan.items.append(Item(compute, "sequence states", z.states,
                               note=f"recurrent/window state x {cfg.max_num_seqs}"))
    if z.ckpt or with_ckpt:
        plan.items.append(Item("host", "state checkpoints", z.ckpt,
                               cfg.state_cache_bytes if z.ckpt < cfg.state_cache_bytes else None,
                               "prefix cache: recurrent-state snapshots (budget)"))
    if dev == "cuda" and z.ckpt:
        rounded = b.pinned_ckpt(z.ckpt)
        plan.items.append(Item("host", "checkpoint rounding", max(0, rounded - z.ckpt),
                               note="pinned host allocator: each layer's snapshot rounded up to a power of two"))
        plan.pinned += rounded
    gathered = gathered_kv_bytes(b.s, cfg, z.max_len) if dev == "cuda" else 0
    plan.items.append(Item(compute, "activations", z.act, note=f"chunk {z.chunk} tokens, rope tables (estimate)"
                           + (f"; gathered KV of one layer {gathered / GiB:.3f} GiB" if gathered else "")))
    plan.kv_blocks = kv_block_count(z.kv_tokens, bs)      # what the engine allocates
    tiered = z.backend in ("offload", "hybrid")
    sizes = dict(max_model_len=z.max_len, max_num_batched_tokens=z.chunk, kv_block_size=bs, kv_blocks=plan.kv_blocks,
                 state_cache_bytes=z.ckpt if with_ckpt else cfg.state_cache_bytes,
                 moe_backend=z.backend if b.n_experts else None, expert_cache_slots=z.slots if tiered else None,
                 expert_cache_policy=(cfg.expert_cache_policy or DEFAULT_POLICY) if tiered else None,
                 expert_tier="disk" if tier else "ram", host_cache_slots=tier.slots if tier else None)
    if 0 < m.host_available < plan.used("host"):     # said, not acted on: sizes follow the budget only
        warn(f"host: {m.host_available / GiB:.2f} GiB free now ({m.host_source}) for a plan of "
             f"{plan.used('host') / GiB:.2f} GiB: other programs hold the rest of the budget (expect pressure)")
    if dev == "cuda" and tiered and b.pool:
        cap = pinning.memlock_limit()
        if cap is not None and b.pool > cap:
            warn(f"page-lock limit (ulimit -l) {cap / GiB:.2f} GiB is below the expert pool's {b.pool / GiB:.2f} GiB: "
                 "pageable banks: cache hits on the device, misses on the CPU")
        else:
            plan.pinned += pinning.registered_bytes(b.pool, regions=6)   # whole pages, at most 6 banks
    plan.options = {k: v for k, v in sizes.items()        # the settings, as `freetoken plan` prints them
                    if v is not None and (k != "state_cache_bytes" or with_ckpt)}
    return sizes
