"""Engine options: one dataclass, read-only; `Settings`, what they resolve to on one machine
(memory/resolve.py), once at startup."""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import defaults
from .errors import InvalidRequestError
from .experts.base import BACKENDS
from .experts.formats import FORMAT_NAMES
from .experts.memory.slots import DEFAULT_POLICY, POLICIES as CACHE_POLICIES, parse_policy
from .kernels.choices import activation_dtype
from .platform import cpu_flags

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


# Memory sizes in GiB; none may exceed 1 PiB (more than any machine: a typo or an attack).
GIB_OPTIONS = ("kv_cache_gib", "memory_headroom_gib", "state_cache_gib", "expert_cache_gib", "host_cache_gib")
MAX_GIB = float(1 << 20)

def check_gib(name: str, value) -> None:
    """The one range check of a GiB size (an option at start, a resize at runtime): None, or a
    number in [0, MAX_GIB]; anything else is a one-line error naming the option."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not 0 <= value <= MAX_GIB):
        raise InvalidRequestError(f"{name}: expected a number of GiB in [0, {MAX_GIB:.0f}], got {value!r}")


# the automatic CPU choices an EngineConfig can force, and the values each takes besides "auto"
FORCED_CHOICES = {"prefill_gemm": ("float32", "bfloat16", "amx", "vdpbf16ps"), "bf16_dot": ("on", "off"),
                  "kernel_isa": ("native", "avx2", "portable"), "decode_gemv": ("amx", "dots"),
                  "decode_attention": ("amx", "fp32"), "prefill_attention": ("amx", "vdpbf16ps", "torch"),
                  "int8_tiles": ("ymm", "zmm")}


@dataclass(frozen=True)
class Flag:
    """The command-line flag of an EngineConfig field (engine/args.py builds `generate`, `serve`,
    `check` and `plan`'s flags from these): `--field-name` unless `option` names it, the field's
    default, int/float from its type; a bool defaulting to False is a `--name` switch, one
    defaulting to True a `--no-name` switch. `help` may be a function, read when the parser is
    built, so a help text quoting defaults.py follows a changed default."""
    help: str | Callable[[], str] | None = None
    option: str | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    on_off: bool = False       # a bool given as `on|off` rather than a switch


def flag(default, **cli) -> dataclasses.Field:
    """A field that is also a flag (`Flag(**cli)`); a field declared without it has none."""
    return dataclasses.field(default=default, metadata={"flag": Flag(**cli)})


@dataclass(frozen=True)
class EngineConfig:
    model: str
    dtype: str = flag("bfloat16", choices=("float32", "bfloat16", "float16"))
    device: str = flag("auto", help="auto | cpu | cuda | cuda:N")     # "auto" -> cuda when present, else cpu
    # Activations: "auto" = float32 on the CPU with the C kernels (they read bf16 weights and KV in
    # place), prefill GEMMs in native bf16 where a calibration measures it faster; elsewhere `dtype`.
    # An explicit dtype holds everywhere. See freetoken/kernels/choices.py.
    compute_dtype: str = "auto"
    # Force one of the CPU's automatic choices (kernels/choices.py) instead of letting the machine
    # decide, e.g. to run a path this CPU would not pick. prefill_gemm: float32 | bfloat16 (torch's
    # prefill GEMMs over bf16 weights) | amx | vdpbf16ps (our tiles, dense and experts); bf16_dot: on | off (bf16 weights x bf16-rounded activations with
    # vdpbf16ps, emulated where the CPU lacks it); kernel_isa: native | avx2 | portable (the C
    # kernels' build, see kernels.variants_here()); decode_gemv: amx | dots (the decode GEMV of
    # bf16 weights on AMX tiles, activations rounded to bf16, or on the dot tiles). "auto": the machine's choice.
    prefill_gemm: str = flag("auto", choices=("auto", *FORCED_CHOICES["prefill_gemm"]),
                             help="force the dtype prefill GEMMs over bf16 weights multiply in (auto: calibrated)")
    bf16_dot: str = flag("auto", choices=("auto", *FORCED_CHOICES["bf16_dot"]),
                         help="force the vdpbf16ps dots with bf16-rounded activations on or off (auto: calibrated)")
    kernel_isa: str = flag("auto", choices=("auto", *FORCED_CHOICES["kernel_isa"]),
                           help="force a C kernel build (auto: the widest this CPU runs)")
    decode_gemv: str = flag("auto", choices=("auto", *FORCED_CHOICES["decode_gemv"]),
                            help="force the decode GEMV of bf16 weights onto AMX tiles or the dot tiles (auto: calibrated)")
    # decode_attention: amx | fp32 (decode attention's scores and values over a bf16 KV cache on AMX
    # tiles, queries and weights split into three exact bf16 parts, or fp32 FMAs; every decode and
    # verify row takes the same path, so speculation stays exact).
    decode_attention: str = flag("auto", choices=("auto", *FORCED_CHOICES["decode_attention"]),
                                 help="force decode attention over a bf16 KV cache onto AMX tiles or fp32 FMAs "
                                      "(auto: calibrated)")
    # prefill_attention: amx | vdpbf16ps | torch (causal prefill attention in bf16 on AMX tiles or
    # with vdpbf16ps, kernels/c/prefill_attention.c, or torch's CPU flash kernel; the same bf16 numerics).
    prefill_attention: str = flag("auto", choices=("auto", *FORCED_CHOICES["prefill_attention"]),
                                  help="force bf16 prefill attention onto AMX tiles, vdpbf16ps tiles or torch's flash kernel "
                                       "(auto: calibrated)")
    # int8_tiles: ymm | zmm (the int8 / mxfp4 experts' and dense rows' int8 dot tiles in 256- or
    # 512-bit registers, kernels/c/int8_zmm.c; the same bits either way: speed alone).
    int8_tiles: str = flag("auto", choices=("auto", *FORCED_CHOICES["int8_tiles"]),
                           help="force the int8 / mxfp4 dot tiles into ymm or zmm registers (auto: calibrated)")
    # How the ggml (GGUF-quantized) layers round activations: q8 = int8 per 32 with fp32 scales in
    # the decode GEMV, exact prefill; llama = llama.cpp's q8_0/q8_1 rounding (fp16 scales and block
    # sums) in both; float32 = exact everywhere (decode dequantizes rows for a GEMM: slower).
    # auto: q8, with the routed experts' prefill through the bf16 tiles (kernels/c/ggml_tiles.c,
    # docs/gguf.md) where the experts' tiles are calibrated or forced. See quant/ggml_act.py.
    # llama-exact: llama.cpp's CPU arithmetic bit for bit on dense Llama-style models in float32
    # (models/llama_numerics.py; slow, for agreeing with llama.cpp). q8k: q8 with the k-quant rows'
    # decode activations per 256 (llama.cpp's Q8_K; kernels/ggml_k256.py), which auto calibrates.
    ggml_numerics: str = flag("auto", choices=("auto", "q8", "q8k", "llama", "llama-exact", "float32"),
                              help="activation rounding of GGUF-quantized layers (auto: q8)")
    max_model_len: int | None = flag(None, help=lambda: "context window (default: the checkpoint's, at most "
                                     f"{defaults.MAX_MODEL_LEN})")
    max_num_seqs: int = 16                 # sequences decoded together (continuous batching)
    max_num_batched_tokens: int = 2048     # tokens per engine step (prefill chunk size)
    kv_block_size: int = 16
    kv_cache_gib: float | None = flag(None, help=lambda: "KV cache budget, prefix cache included (default: "
                                      f"max_num_seqs x max_model_len tokens, at most {defaults.KV_CACHE_GIB:g} GiB)")
    # Host memory the plan leaves to the rest of the machine; None: defaults.HOST_HEADROOM_*
    memory_headroom_gib: float | None = flag(None, help=lambda: "host memory the plan leaves to the rest of the "
                                             f"machine (default max({100 // defaults.HOST_HEADROOM_DIVISOR}%%, "
                                             f"{defaults.HOST_HEADROOM_GIB:g} GiB))")
    num_threads: int | None = flag(None, option="--threads", help="CPU threads (default: all cores)")
    # Prefix cache (engine/prefix/cache.py): finished and running sequences leave their KV
    # blocks in a radix tree (inside kv_cache_gib); hybrid models also keep state snapshots.
    prefix_cache: bool = flag(True, help="recompute every prompt from its first token (no KV/state reuse "
                                         "across requests)")
    state_checkpoints: int = flag(16, help="hybrid models: state snapshots kept per session for prefix reuse")
    # all state snapshots together (host memory); None: up to defaults.STATE_CACHE_GIB, as host memory allows
    state_cache_gib: float | None = flag(None, help=lambda: "hybrid models: all state snapshots together "
                                         f"(default: up to {defaults.STATE_CACHE_GIB:g}, as host memory allows)")
    # Expert memory (see freetoken/experts/).
    moe_backend: str = flag("auto", choices=("auto", *BACKENDS))    # resident | offload | cpu | hybrid | auto
    expert_cache_slots: int | None = flag(None)
    expert_cache_gib: float | None = flag(None)
    # Replacement policy of the expert cache (experts/memory/slots.py): lru | lfu | lrfu | arc, "+admit" for
    # admission control, "+layer" for layer-aware eviction, then "+prefetch" for next-layer prefetch,
    # then "+budget" (prefetch within a transfer budget), then "+prompt" (lrfu: prompt-weighted counts);
    # None = the measured default (docs/benchmarks.md).
    expert_cache_policy: str | None = flag(
        None, metavar="POLICY", help=f"expert cache replacement: {', '.join(CACHE_POLICIES)}, optionally +admit "
        f"(admission control), +layer (layer-aware eviction), then +prefetch (next-layer prefetch) and then "
        f"+budget (prefetch within 1.1x the copies made without it), then +prompt (lrfu: a prompt counts each "
        f"expert by the recency-weighted share of its tokens that routed it); "
        f"default {DEFAULT_POLICY}")
    # Three tiers (experts/disk/backend.py): "disk" keeps the expert pool in the model file behind a host
    # cache of host_cache_gib / host_cache_slots whole experts; "ram" loads the pool; "auto": disk
    # when the memory plan finds the pool does not fit host memory, or a host cache size is given.
    expert_tier: str = flag("auto", choices=("auto", "ram", "disk"),
                            help="disk: keep the expert pool in the model file behind a host cache (auto: when the "
                                 "pool does not fit host memory, or --host-cache-gib/--host-cache-slots is given)")
    host_cache_gib: float | None = flag(None, help="disk tier: host expert cache size")
    host_cache_slots: int | None = flag(None, help="disk tier: host expert cache, whole experts")
    # disk tier (experts/disk/): which next-layer guess is read ahead (lookahead.py: "router" applies
    # layer l+1's router to layer l's input, "history" learns from past routing, "auto" = router
    # where the model has one), O_DIRECT reads (direct.py), reads in flight (None: the profile's best)
    expert_lookahead: str = flag("auto", choices=("auto", "router", "history", "off"),
                                 help="disk tier: read ahead layer l+1's experts as guessed by its router on layer "
                                      "l's input (router), by past routing (history), or not (off)")
    disk_direct_io: str = flag("auto", choices=("auto", "on", "off"),
                               help="disk tier: O_DIRECT reads, no page cache (auto: where the filesystem allows)")
    disk_io_threads: int | None = flag(None, help="disk tier: expert reads in flight (default: the queue depth "
                                                  "`freetoken profile` measured best, else 4)")
    expert_format: str | None = flag(None, choices=FORMAT_NAMES,
                                     help="re-encode float experts at load (e.g. int8 ~ llama.cpp Q8_0)")
    # Dense layers (attention, dense MLPs, shared experts, lm_head): None keeps `dtype`;
    # "int8" stores them as int8 + fp16 scale per 32 (llama.cpp Q8_0 size), run by the CPU kernels;
    # GGUF weights in a llama.cpp quantization stay in it on the CPU ("float": dequantized at load).
    dense_format: str | None = flag(None, choices=("int8", "float"),
                                    help="store attention/dense/lm_head weights as int8 (with --expert-format int8: "
                                         "a Q8_0-sized model); float: dequantize a GGUF's quantized dense weights "
                                         "at load (default: kept packed)")
    bandwidth_profile: str | None = None   # JSON written by `freetoken profile`
    record_routing: str | None = flag(None, metavar="FILE", help="record every step's routing (JSONL)")
    verify_weights: bool = flag(True, option="--verify", on_off=True,
                                help="FTW files: verify every tensor's checksum while reading (default on)")
    # Decode steps of 1..max_num_seqs sequences as CUDA graph replays (engine/cuda_graphs.py):
    # off until the GPU check has passed on a real device; resident experts only.
    cuda_graphs: bool = flag(False, help="decode batches of up to the most sequences decoded together as CUDA "
                                         "graph replays (resident experts only; off by default until checked on a "
                                         "real GPU)")
    # Speculative decoding (engine/spec/): drafts from the sessions' own history (suffix) or the
    # prompt (ngram), the checkpoint's nextn layer (mtp: refused at load where it has none) or a
    # draft model, verified exactly in one forward; auto drafts only where the price says it pays.
    speculative: str = flag("auto", choices=("auto", "off", "suffix", "ngram", "mtp", "draft"),
                            help="draft tokens and verify them in one step (auto: the drafter and length "
                                 "expected to pay, else none)")
    # 16: accepted runs on agent sessions are bimodal (median 1, p90 16); the price picks k <= K
    spec_max_draft: int = flag(16, metavar="K", help="speculative decoding: at most K drafted tokens a step")
    # Drafts as an expert lookahead (engine/spec/lookahead.py): the experts a verify's tokens routed
    # to before are copied into the device/host cache ahead of their layer. Outputs do not change.
    spec_lookahead: bool = flag(True, help="speculative decoding: prefetch the experts each verify's drafted "
                                           "tokens routed to before (default on)")
    # The verify price's prior shape measured (engine/verify_probe.py): forwards of 1..K+1 positions
    # timed on a scratch sequence the first time a model is served here, cached like the kernel
    # calibrations; off: the price learns the curve from the run's own steps alone.
    spec_probe: bool = flag(True, help="speculative decoding: measure the verify cost curve of this machine and "
                                       "model once (cached) as the price's prior (default on)")
    # A separate draft model with the same tokenizer (engine/spec/draft_model.py): drafts under
    # `--speculative draft`, and is one more candidate under auto.
    draft_model: str | None = flag(None, metavar="PATH", help="speculative decoding: a small model with the same "
                                   "tokenizer that drafts (with --speculative draft or auto)")
    seed: int = 0

    def __post_init__(self):
        if self.dtype not in _DTYPES:
            raise InvalidRequestError(f"dtype: expected one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.compute_dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise InvalidRequestError(f"compute_dtype: expected auto|float32|bfloat16|float16, got {self.compute_dtype!r}")
        for f in dataclasses.fields(self):   # a flag's choices are all its field takes (dtype also takes aliases)
            choices = f.metadata["flag"].choices if "flag" in f.metadata and f.name != "dtype" else None
            v = getattr(self, f.name)
            if choices and v not in choices and not (v is None and f.default is None):
                none = " or none" if f.default is None else ""
                raise InvalidRequestError(f"{f.name}: expected {'|'.join(choices)}{none}, got {v!r}")
        if self.expert_cache_policy is not None:
            try:
                parse_policy(self.expert_cache_policy)
            except ValueError as e:
                raise InvalidRequestError(f"expert_cache_policy: {e}") from None
        for name in GIB_OPTIONS:      # before any plan multiplies them (1e308 GiB overflows int())
            check_gib(name, getattr(self, name))
        for name in ("host_cache_gib", "host_cache_slots", "disk_io_threads"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise InvalidRequestError(f"{name}: expected > 0, got {getattr(self, name)}")
        if self.memory_headroom_gib is not None and not self.memory_headroom_gib >= 0:
            raise InvalidRequestError(f"memory_headroom_gib: expected >= 0, got {self.memory_headroom_gib}")
        if self.state_cache_gib is not None and self.state_cache_gib < 0:
            raise InvalidRequestError(f"state_cache_gib: expected >= 0, got {self.state_cache_gib}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "kv_block_size", "state_checkpoints"):
            if getattr(self, name) < 1:
                raise InvalidRequestError(f"{name}: expected a positive integer, got {getattr(self, name)}")
        if self.speculative == "draft" and not self.draft_model:
            raise InvalidRequestError("speculative: draft needs --draft-model PATH (a small model with the same tokenizer)")
        if self.draft_model and self.speculative not in ("auto", "draft"):
            raise InvalidRequestError(f"draft_model: only used with --speculative draft or auto, "
                                      f"not {self.speculative}")
        if not 1 <= self.spec_max_draft <= 64:
            raise InvalidRequestError(f"spec_max_draft: expected 1..64, got {self.spec_max_draft}")
        if self.cuda_graphs:                # what is known before loading; the engine checks the rest
            check_cuda_graphs(self.torch_device, None if self.moe_backend == "auto" else self.moe_backend,
                              self.expert_tier, False, bool(self.record_routing))

    @property
    def state_cache_bytes(self) -> int:
        return int((defaults.STATE_CACHE_GIB if self.state_cache_gib is None else self.state_cache_gib) * (1 << 30))

    @property
    def disk_tier(self) -> bool:
        """The expert pool stays in the file (forced, or a host cache size given)."""
        return self.expert_tier == "disk" or (self.expert_tier == "auto" and (
            self.host_cache_gib is not None or self.host_cache_slots is not None))

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    @classmethod
    def from_options(cls, model: str | os.PathLike, **options) -> "EngineConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise InvalidRequestError(f"unknown engine option(s) {unknown}; expected some of {sorted(known - {'model'})}")
        from .weights.stores import resolve_model     # a path, an Ollama name or an HF repo id
        return cls(model=resolve_model(model), **options)


def check_cuda_graphs(device: torch.device, moe_backend: str | None, expert_tier: str | None,
                    has_state: bool, record_routing: bool = False) -> None:
    """One-line refusal of a setting whose decode step cannot be captured by decode CUDA graphs
    (engine/cuda_graphs.py); the engine checks it again once the model is loaded (`has_state`)."""
    if device.type != "cuda":
        raise InvalidRequestError(f"cuda_graphs: needs a CUDA device, this engine runs on {device.type}")
    if expert_tier == "disk":
        raise InvalidRequestError("cuda_graphs: the disk expert tier reads experts on the host every layer; "
                                  "turn cuda_graphs off or load the pool (expert_tier ram)")
    if moe_backend not in (None, "resident"):
        raise InvalidRequestError(f"cuda_graphs: moe_backend {moe_backend} runs host-side work every layer "
                                  "(decisions, the CPU branch); only resident experts can be captured")
    if record_routing:
        raise InvalidRequestError("cuda_graphs: record_routing reads every step's routing on the host; "
                                  "turn one of them off")
    if has_state:
        raise InvalidRequestError("cuda_graphs: this model keeps a per-sequence recurrent state, "
                                  "which decode graphs do not capture yet")



def activation_dtype_for(cfg: EngineConfig) -> torch.dtype:
    """The activations' dtype the options ask for on their device (the model makes the final
    call once its kernels are built: kernels.choices)."""
    device = cfg.torch_device
    return activation_dtype(cfg.torch_dtype, device, cfg.compute_dtype, kernels=device.type == "cpu",
                            flags=cpu_flags())


def spin_us() -> int:
    """How long idle kernel-pool workers spin before sleeping (FREETOKEN_SPIN_US, microseconds)."""
    raw = os.environ.get("FREETOKEN_SPIN_US", str(defaults.SPIN_US))
    if not raw.strip().isdigit():
        raise InvalidRequestError(f"FREETOKEN_SPIN_US: expected a non-negative integer (microseconds), got {raw!r}")
    return int(raw)


@dataclass(frozen=True)
class Settings:
    """What an engine runs with: every "auto" and every size of the options made concrete for
    one checkpoint on one machine, in blocks and slots. Made once, by `memory.resolve.resolve`
    (the memory plan's decisions included); the engine, the loader and the experts backend read
    it and decide nothing again. The loader adds only what loading found out (the model's final
    compute dtype; `pinned` False when page-locking was refused)."""
    device: torch.device
    dtype: torch.dtype               # storage precision: embeddings, routed experts, KV cache
    compute_dtype: torch.dtype       # activations and dense layers' compute
    max_model_len: int
    max_num_batched_tokens: int      # tokens per engine step (the prefill chunk)
    kv_block_size: int
    kv_blocks: int | None            # KV blocks to allocate, the null block included; None: no plan
                                     # could be made, the engine counts them from the layers it built
    state_cache_bytes: int           # hybrid models: the state-checkpoint budget of the prefix cache
    num_threads: int | None          # kernel pool / torch threads; None = one per physical core
    spin_us: int
    moe_backend: str | None = None   # None: a dense model (no routed experts)
    # offload/hybrid: slots of the expert cache; None on CUDA when no plan could be made (the
    # backend sizes it at its first step from the free VRAM)
    expert_cache_slots: int | None = None
    expert_cache_policy: str | None = None
    expert_tier: str = "ram"                 # "disk": the pool stays in the file (experts/disk/backend.py)
    host_cache_slots: int | None = None      # disk tier: whole experts in the host cache
    max_num_seqs: int = 16                   # sequences decoded together (the option, taken as it is)
    prefix_cache: bool = True                # KV/state reuse across requests (the option)
    pinned: bool | None = None               # False: the pool could not be page-locked (hits on the device, misses on the CPU)
    plan: object = dataclasses.field(default=None, repr=False, compare=False)   # memory.plan.MemoryPlan, or None

    def table(self, **more) -> str:
        """One aligned `name  value` row per setting (and per extra keyword), for the start-up log."""
        rows = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "plan"}
        rows.update(more)
        rows["num_threads"] = rows["num_threads"] or "one per physical core"
        width = max(map(len, rows))
        return "\n".join(f"  {k:<{width}}  {str(v).replace('torch.', '')}" for k, v in rows.items() if v is not None)
