"""The engine options as command-line flags (`freetoken generate`, `serve`, `check`, `plan`):
`add_engine_args(parser)` and, from the parsed flags, `engine_options(args)` for `LLM(...)`."""
from __future__ import annotations

import argparse

from .. import defaults
from ..experts.base import BACKENDS
from ..experts.formats import FORMAT_NAMES
from ..experts.slots import DEFAULT_POLICY, POLICIES as CACHE_POLICIES


def add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--moe-backend", default="auto", choices=["auto", *BACKENDS])
    p.add_argument("--expert-cache-slots", type=int, default=None)
    p.add_argument("--expert-cache-gib", type=float, default=None)
    p.add_argument("--expert-cache-policy", default=None, metavar="POLICY",
                   help=f"expert cache replacement: {', '.join(CACHE_POLICIES)}, optionally +admit "
                        f"(admission control) and then +prefetch (next-layer prefetch); default {DEFAULT_POLICY}")
    p.add_argument("--expert-tier", default="auto", choices=["auto", "ram", "disk"],
                   help="disk: keep the expert pool in the model file behind a host cache (auto: when the "
                        "pool does not fit host memory, or --host-cache-gib/--host-cache-slots is given)")
    p.add_argument("--host-cache-gib", type=float, default=None, help="disk tier: host expert cache size")
    p.add_argument("--host-cache-slots", type=int, default=None, help="disk tier: host expert cache, whole experts")
    p.add_argument("--expert-format", default=None, choices=FORMAT_NAMES,
                   help="re-encode float experts at load (e.g. int8 ~ llama.cpp Q8_0)")
    p.add_argument("--dense-format", default=None, choices=["int8", "float"],
                   help="store attention/dense/lm_head weights as int8 (with --expert-format int8: a Q8_0-sized model); "
                        "float: dequantize a GGUF's quantized dense weights at load (default: kept packed)")
    p.add_argument("--prefill-gemm", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="force the dtype prefill GEMMs over bf16 weights multiply in (auto: calibrated)")
    p.add_argument("--bf16-dot", default="auto", choices=["auto", "on", "off"],
                   help="force the vdpbf16ps dots with bf16-rounded activations on or off (auto: calibrated)")
    p.add_argument("--kernel-isa", default="auto", choices=["auto", "native", "avx2", "portable"],
                   help="force a C kernel build (auto: the widest this CPU runs)")
    p.add_argument("--record-routing", default=None, metavar="FILE", help="record every step's routing (JSONL)")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="decode batches of up to the most sequences decoded together as CUDA graph replays (resident experts only; "
                        "off by default until checked on a real GPU)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help=f"context window (default: the checkpoint's, at most {defaults.MAX_MODEL_LEN})")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--verify", default="on", choices=["on", "off"],
                   help="FTW files: verify every tensor's checksum while reading (default on)")
    p.add_argument("--kv-cache-gib", type=float, default=None,
                   help="KV cache budget, prefix cache included (default: max_num_seqs x max_model_len "
                        f"tokens, at most {defaults.KV_CACHE_GIB:g} GiB)")
    p.add_argument("--memory-headroom-gib", type=float, default=None,
                   help="host memory the plan leaves to the rest of the machine (default "
                        f"max({100 // defaults.HOST_HEADROOM_DIVISOR}%%, {defaults.HOST_HEADROOM_GIB:g} GiB))")
    p.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                   help="recompute every prompt from its first token (no KV/state reuse across requests)")
    p.add_argument("--state-checkpoints", type=int, default=16,
                   help="hybrid models: state snapshots kept per session for prefix reuse")
    p.add_argument("--state-cache-gib", type=float, default=None,
                   help="hybrid models: all state snapshots together (default: up to "
                        f"{defaults.STATE_CACHE_GIB:g}, as host memory allows)")


def engine_options(args) -> dict:
    return dict(dtype=args.dtype, device=args.device, moe_backend=args.moe_backend,
                expert_cache_slots=args.expert_cache_slots, expert_cache_gib=args.expert_cache_gib,
                expert_cache_policy=args.expert_cache_policy, expert_tier=args.expert_tier,
                host_cache_gib=args.host_cache_gib, host_cache_slots=args.host_cache_slots,
                max_model_len=args.max_model_len, num_threads=args.threads, expert_format=args.expert_format,
                dense_format=args.dense_format, record_routing=args.record_routing, kv_cache_gib=args.kv_cache_gib,
                prefix_cache=args.prefix_cache, state_checkpoints=args.state_checkpoints,
                state_cache_gib=args.state_cache_gib, verify_weights=args.verify == "on",
                memory_headroom_gib=args.memory_headroom_gib, prefill_gemm=args.prefill_gemm,
                bf16_dot=args.bf16_dot, kernel_isa=args.kernel_isa, cuda_graphs=args.cuda_graphs)
