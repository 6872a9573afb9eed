"""`freetoken convert`: write an FTW file (see weights/ftw/format.py) from an HF checkpoint directory or a GGUF file."""
from __future__ import annotations

import time
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "convert", help="write an FTW file: the model in its runtime layout, loaded at disk speed",
        description="Convert an HF checkpoint directory or a GGUF file into one FTW file: expert banks already in the "
                    "chosen format and runtime layout, the other tensors, tokenizer and config, with a "
                    "checksum per tensor. Serve it with `freetoken serve --model FILE.ftw`.")
    p.add_argument("--model", required=True, help="HF checkpoint directory or GGUF file (every tensor kept as the "
                                                  "GGUF has it: its bytes, its llama.cpp quantization)")
    p.add_argument("--out", required=True, help="FTW file to write (e.g. model.ftw)")
    p.add_argument("--expert-format", default=None, choices=["int8", "fp8", "mxfp4", "bf16", "fp16", "fp32"],
                   help="re-encode float experts (default: keep the checkpoint's format)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="storage of float experts (default: the checkpoint's dtype; a GGUF's tensors are kept as they "
                        "are, its float experts take the serving --dtype at load)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for re-encoding")
    p.set_defaults(func=main)


def main(args) -> int:
    from ..loading.convert import convert
    from ..weights.stores import resolve_model
    t0 = time.perf_counter()
    header = convert(resolve_model(args.model), args.out, expert_format=args.expert_format, dtype=args.dtype,
                     num_threads=args.threads)
    nbytes = Path(args.out).stat().st_size
    ex = header["experts"]
    what = (f"{ex['num_layers']} MoE layers x {ex['num_experts']} experts as {ex['spec']['fmt']}"
            if ex else "the GGUF's tensors as they are" if header.get("gguf") else "no experts")
    print(f"wrote {args.out}: {len(header['tensors'])} tensors, {nbytes / 2**30:.2f} GiB, {what} "
          f"({time.perf_counter() - t0:.1f} s)")
    return 0
