"""Prefill and decode speed of the hybrid architectures, FreeToken vs transformers.

    .venv/bin/python bench/decode_prefill_hybrid.py [--arch qwen3_5_moe|gpt_oss_mxfp4|all]
        [--threads 2] [--prompt 512] [--decode 64] [--rounds 3]

Batch 1, bf16 activations, random weights with realistic per-layer shapes and few layers:
  qwen3_5_moe     Qwen3.5-35B-A3B layer shapes (hidden 2048, 16/32 linear k/v heads of 128,
                  gated attention 16 heads x 256, experts of 512 + shared expert), 64 experts
                  top-8, 4 layers (3 DeltaNet + 1 full attention)
  gpt_oss_mxfp4   gpt-oss-20b attention shapes (64 heads x 64, 8 kv heads, window 128, sinks),
                  16 MXFP4 experts top-4 of hidden/intermediate 2048, 4 layers. FreeToken keeps
                  the experts packed (4.25 bits/weight); transformers on a CPU dequantizes them
                  to bf16 at load, so it runs a bf16 copy of the same dequantized weights.
Prints tok/s for both engines and the ratios freetoken/transformers: the protocol of
decode_prefill.py (fresh prompts, FreeToken's prefix cache off, medians of the same rounds)."""
from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import CACHE, fresh_prompts, medium_checkpoint, set_threads  # noqa: E402
from decode_prefill import bench_freetoken, bench_transformers  # noqa: E402

MEDIUM = {
    "qwen3_5_moe": dict(layers=4, experts=64, top_k=8, hidden=2048, vocab=8192, moe_intermediate_size=512,
                        shared_expert_intermediate_size=512, num_attention_heads=16, num_key_value_heads=2,
                        head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                        linear_value_head_dim=128, max_position_embeddings=4096,
                        layer_types=["linear_attention"] * 3 + ["full_attention"]),
    "gpt_oss_mxfp4": dict(layers=4, experts=16, top_k=4, hidden=2048, vocab=8192, intermediate_size=2048,
                          num_attention_heads=64, num_key_value_heads=8, head_dim=64, sliding_window=128,
                          max_position_embeddings=4096),
}


def dequantized_copy(mx_dir: Path) -> Path:
    """What transformers loads on a CPU: the MXFP4 experts dequantized (its own routine) to bf16."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    out = mx_dir.with_name(mx_dir.name + "-dequantized")
    if (out / "config.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    for f in mx_dir.iterdir():
        if f.suffix not in (".safetensors",) and f.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy(f, out / f.name)
    tensors = {}
    for f in sorted(mx_dir.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            for name in h.keys():
                if name.endswith("_blocks"):
                    base = name[: -len("_blocks")]
                    tensors[base] = convert_moe_packed_tensors(h.get_tensor(name), h.get_tensor(base + "_scales"),
                                                               dtype=torch.bfloat16)
                elif not name.endswith("_scales"):
                    tensors[name] = h.get_tensor(name)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((mx_dir / "config.json").read_text())
    cfg.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def run(arch: str, args) -> None:
    d = medium_checkpoint(arch, f"{arch.replace('_', '-')}-medium", **MEDIUM[arch])
    ref_dir = dequantized_copy(d) if arch.endswith("_mxfp4") else d
    prompts = fresh_prompts(1 + 2 * args.rounds, args.prompt)
    ft_p, ft_d, ft_tokens, used = bench_freetoken(d, prompts, args.decode, args.threads, args.backend)
    gc.collect()
    if args.skip_transformers:
        print(f"\n{arch}: freetoken prefill {ft_p:.1f} tok/s, decode {ft_d:.2f} tok/s (backend {used})", flush=True)
        return
    tf_p, tf_d, tf_tokens = bench_transformers(ref_dir, prompts, args.decode)
    gc.collect()
    same = next((i for i, (a, b) in enumerate(zip(ft_tokens, tf_tokens)) if a != b), len(ft_tokens))
    print(f"\n{arch} ({d}), bf16, batch 1, {args.threads} threads, prompt {args.prompt}, decode {args.decode}, "
          f"freetoken moe backend {used}, median of {args.rounds} rounds, fresh prompts, no prefix cache")
    print(f"{'':12}{'prefill tok/s':>15}{'decode tok/s':>15}")
    print(f"{'freetoken':12}{ft_p:15.1f}{ft_d:15.2f}")
    print(f"{'transformers':12}{tf_p:15.1f}{tf_d:15.2f}")
    print(f"{'ratio':12}{ft_p / tf_p:14.2f}x{ft_d / tf_d:14.2f}x")
    print(f"greedy tokens identical for the first {same} of {len(ft_tokens)}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="all", choices=["all", *MEDIUM])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per engine (medians reported)")
    ap.add_argument("--skip-transformers", action="store_true", help="FreeToken figures only")
    args = ap.parse_args()
    set_threads(args.threads)
    print(f"checkpoints cached under {CACHE}")
    for arch in (MEDIUM if args.arch == "all" else [args.arch]):
        run(arch, args)


if __name__ == "__main__":
    main()
