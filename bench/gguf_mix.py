"""A dynamic-mix GGUF (unsloth-style: gate, up and down of a layer in their own types, the layers
different from each other) written from a float GGUF, for bench/gguf_types_memory.py (issue 33
item 2: a layer whose gate and up differ in row width used to pad the narrower one).

    PYTHONPATH=. .venv/bin/python bench/gguf_mix.py SRC.gguf|random OUT.gguf [--gate Q2_K,Q3_K]
        [--up Q4_K,Q5_K] [--down IQ4_XS,Q6_K,Q4_K] [--shape 1024,32,512,4]

SRC "random": a random Qwen3-MoE of --shape (hidden, experts, expert intermediate, layers)
converted to F32 by llama.cpp's converter, cached in ~/.cache/freetoken/bench. Layer N's gate gets the (N mod len)-th type of --gate, likewise up and down; the values are
the source's, quantized by FreeToken's quantizers (tests/weights/gguf_rewrite.py); every other
tensor is copied as it is."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "weights"))
from gguf_rewrite import rewrite  # noqa: E402
from llamacpp import convert, llama_cpp_source  # noqa: E402

from freetoken.quant import ggml_quants as gq  # noqa: E402


def random_source(shape: str) -> Path:
    from freetoken.tiny import make_tiny
    h, e, i, n = (int(x) for x in shape.split(","))
    root = Path.home() / ".cache" / "freetoken" / "bench"
    name = f"qwen3-moe-{h}h-{e}e-{i}i-{n}l"
    out = root / f"{name}-f32.gguf"
    if not out.exists():
        print(f"building {out} (random weights) ...", flush=True)
        d = make_tiny("qwen3_moe", root / name, hidden=h, experts=e, moe_intermediate_size=i, layers=n)
        convert(llama_cpp_source(), d, out, "f32")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("out", type=Path)
    ap.add_argument("--gate", default="Q2_K,Q3_K")
    ap.add_argument("--up", default="Q4_K,Q5_K")
    ap.add_argument("--down", default="IQ4_XS,Q6_K,Q4_K")
    ap.add_argument("--shape", default="1024,32,512,4")
    a = ap.parse_args(argv)
    ids = {v: k for k, v in gq.NAMES.items()}
    try:
        types = {p: [ids[n] for n in getattr(a, p).split(",")] for p in ("gate", "up", "down")}
    except KeyError as e:
        ap.error(f"unknown ggml type {e.args[0]} (known: {', '.join(gq.NAMES.values())})")

    def type_of(name: str, shape) -> int | None:
        part = next((p for p in types if f".ffn_{p}_exps." in name), None)
        if part is None:
            return None
        kinds = types[part]
        return kinds[int(name.split(".")[1]) % len(kinds)]

    rewrite(random_source(a.shape) if a.src == "random" else Path(a.src), a.out, type_of)
    print(f"wrote {a.out} ({a.out.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
