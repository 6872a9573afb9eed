"""`freetoken profile`: measure B_P and B_H on this machine for one expert format and write
them to the bandwidth profile the runtime reads (see bandwidth.py).

  B_P  host -> cache copies of whole expert rows (pinned when CUDA is present), 8 at a time
  B_H  the CPU branch executing one decode token through 8 experts, in weight bytes/s
  both also measured at the same time (they share the host memory system)
  B_D  the disk: whole-expert reads at random offsets, uncached, 4 in flight (the disk
       tier's reads; --disk-file to read a given file, else a scratch file beside --out)

The expert shapes and format come from --model's config.json (random rows of that exact
layout: bandwidth depends on bytes and layout, not on values), or from --hidden etc.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ..experts.measure.bandwidth import DEFAULT_PROFILE, device_id, save_profile
from ..experts.formats import FORMAT_NAMES
from ..experts.measure.probe import measure, synthetic_pool

def register(subparsers) -> None:
    p = subparsers.add_parser("profile", help="measure expert copy (B_P) and CPU (B_H) bandwidth for q*",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model directory: take the expert shapes and format from its config.json")
    p.add_argument("--out", default=str(DEFAULT_PROFILE), help=f"profile JSON to update (default {DEFAULT_PROFILE})")
    p.add_argument("--device", default="auto", help="cache device: auto | cpu | cuda[:N]")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=768)
    p.add_argument("--format", default="bf16", choices=FORMAT_NAMES)
    p.add_argument("--pool-gib", type=float, default=1.0, help="size of the test pool (larger than the caches)")
    p.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    p.add_argument("--threads", type=int, default=None, help="CPU expert threads (default: all physical cores)")
    p.add_argument("--disk-file", default=None, help="measure B_D reading this file (e.g. the model); default: "
                                                      "a 512 MiB scratch file written beside --out")
    p.add_argument("--no-disk", action="store_true", help="skip B_D")
    p.add_argument("--link-gbs", type=float, default=None, help="emulate a link of this speed (testing)")
    p.set_defaults(func=main)


def model_format(model_dir: str) -> tuple[int, int, str]:
    from ..errors import CheckpointError
    from ..weights.checkpoint import read_json
    path = Path(model_dir) / "config.json"
    cfg = read_json(path, "config.json")
    cfg = cfg.get("text_config", cfg)
    hidden = cfg.get("hidden_size")
    inter = cfg.get("moe_intermediate_size") or cfg.get("intermediate_size")
    if not hidden or not inter:
        raise CheckpointError(f"{path}: needs hidden_size and moe_intermediate_size (or intermediate_size)")
    quant = (cfg.get("quantization_config") or {}).get("quant_method", "")
    if quant == "mxfp4":
        return hidden, inter, "mxfp4"
    if quant == "fp8":
        return hidden, inter, "fp8"
    dtype = str(cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16")
    return hidden, inter, {"float32": "fp32", "float16": "fp16"}.get(dtype, "bf16")


def main(args) -> int:
    hidden, inter, fmt = (model_format(args.model) if args.model
                          else (args.hidden, args.intermediate, args.format))
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    pool = synthetic_pool(hidden, inter, fmt, args.pool_gib)
    print(f"profiling {pool.num_experts} experts of {pool.expert_nbytes / 2**20:.2f} MiB ({fmt}, {hidden}x{inter}) "
          f"on {device_id(device)} ...", flush=True)
    prof = measure(pool, device, args.seconds, args.threads,
                   args.link_gbs * 1e9 if args.link_gbs else None)
    try:
        from ..experts.measure.membw import read_bandwidth
        prof.read_bw = read_bandwidth(num_threads=args.threads)
    except Exception:                      # the roofline is informative only
        prof.read_bw = None
    if not args.no_disk:
        from ..experts.measure.diskbw import best_queue_depth, scratch_bandwidth
        try:
            sweep = (best_queue_depth(args.disk_file, prof.expert_nbytes, args.seconds / 2) if args.disk_file else
                     scratch_bandwidth(Path(args.out).parent, prof.expert_nbytes, args.seconds / 2,
                                       measure=best_queue_depth))
            prof.disk_queue_depth, prof.b_d, table = sweep
            prof.disk_direct = _direct_ok(args.disk_file or Path(args.out).parent)
            print("disk reads in flight -> GB/s: " + ", ".join(f"{d}: {v / 1e9:.2f}" for d, v in table.items()))
        except (OSError, ValueError) as e:
            print(f"B_D not measured: {e}")
    save_profile(args.out, prof)
    print(f"B_P {prof.b_p / 1e9:.1f} GB/s alone, {prof.b_p_shared / 1e9:.1f} GB/s shared\n"
          f"B_H {prof.b_h / 1e9:.1f} GB/s alone, CPU branch {prof.b_h_shared / 1e9:.1f} GB/s while copying\n"
          + (f"host read bandwidth {prof.read_bw / 1e9:.1f} GB/s (B_H reaches {prof.b_h / prof.read_bw:.0%})\n"
             if prof.read_bw else "")
          + (f"B_D {prof.b_d / 1e9:.2f} GB/s (disk, whole-expert reads, {prof.disk_queue_depth} in flight, "
             f"{'O_DIRECT' if prof.disk_direct else 'buffered'})\n" if prof.b_d else "")
          + f"q*/m = {prof.b_p / prof.b_h:.2f}   written to {args.out} [{prof.key}]")
    return 0


def _direct_ok(where) -> bool:
    """Whether O_DIRECT reads work on `where`'s filesystem (a file, or a folder: a scratch file in it)."""
    import os
    import tempfile
    from ..experts.disk.direct import open_direct
    where = Path(where)
    if where.is_file():
        fd = open_direct(where, "auto")
    else:
        with tempfile.NamedTemporaryFile(dir=where, prefix=".freetoken-direct-") as f:
            f.write(b"\0" * 8192)
            f.flush()
            fd = open_direct(f.name, "auto")
    if fd is None:
        return False
    os.close(fd)
    return True
