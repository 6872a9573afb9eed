"""llama.cpp's own quantizer applied to a GGUF (`llama_model_quantize` through llama-cpp-python's
ctypes API, as `llama-quantize` runs it), in a child process of the python that has llama_cpp
(llamacpp_setup.ensure_llamacpp). bench/vs_llamacpp.py makes its quantizer mixes with it from a
bf16 GGUF; bench/quality.py requantizes a real model's already quantized GGUF with it
(`allow_requantize`, llama-quantize's --allow-requantize: each tensor dequantized, then
quantized to the mix's type for it).

llama.cpp picks each tensor's type by the mix (llama_tensor_get_type): a K- or i-quant needs rows
of a multiple of 256 values and falls back for narrower ones (Q4_K -> Q5_0, Q6_K -> Q8_0, Q2_K /
Q3_K / IQ4_XS / the lattice i-quants -> IQ4_NL), so on a small model a mix is a mix of types:
`type_mix` says which."""
from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

# llama.cpp's lattice i-quant mixes: made with a uniform importance matrix (see uniform_imatrix)
IQUANTS = ("iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s")

QUANTIZE = textwrap.dedent("""
    import ctypes, json, os, sys
    import llama_cpp as L
    src, dst, ftype, requant = sys.argv[1], sys.argv[2], getattr(L, sys.argv[3]), sys.argv[4:] == ["requantize"]
    p = L.llama_model_quantize_default_params()
    p.ftype, p.nthread, p.allow_requantize = ftype, 2, requant
    imatrix = json.loads(sys.stdin.read() or "null")   # {tensor: values per column (x experts)} or null
    if imatrix:                                         # kept alive until the call returns
        keep = [(n.encode(), (ctypes.c_float * k)(*([1.0] * k))) for n, k in imatrix.items()]
        arr = (L.llama_model_imatrix_data * (len(keep) + 1))()
        for i, (n, d) in enumerate(keep):
            arr[i].name, arr[i].data, arr[i].size = n, d, len(d)
        p.imatrix = arr                                 # the last entry (name NULL) ends the list
    L.llama_backend_init()
    assert L.llama_model_quantize(src.encode(), (dst + ".partial").encode(), ctypes.byref(p)) == 0
    os.rename(dst + ".partial", dst)                  # another process may be waiting for this name
""")
QUANT_TYPES = {f: f"LLAMA_FTYPE_MOSTLY_{f.upper()}" for f in ("q8_0", "q6_k", "q5_0", "q5_1", "q4_0", "q4_1", "q4_k_m",
                                                              "q3_k_m", "q2_k", "iq4_nl", "iq4_xs", *IQUANTS)}


def uniform_imatrix(gguf_path: Path) -> dict[str, int]:
    """A uniform importance matrix (every column weighs the same) for the lattice i-quants, which
    llama.cpp refuses to make without one: the value count of each 2-D/3-D weight (columns x
    experts), as llama.cpp's imatrix tool would store it. Not a measured imatrix: the issue allows
    "an importance matrix made by its imatrix tool or a uniform one"."""
    from gguf import GGUFReader
    out = {}
    for t in GGUFReader(str(gguf_path)).tensors:
        shape = [int(x) for x in t.shape]               # ggml order: columns first
        if len(shape) >= 2 and t.name.endswith(".weight") and not t.name.startswith(("token_embd", "output")):
            out[t.name] = shape[0] * (shape[2] if len(shape) == 3 else 1)
    return out


def quantize(py: Path, src: Path, out: Path, gtype: str, allow_requantize: bool = False) -> Path:
    """`src` quantized by llama.cpp into `out` as the mix `gtype` (a QUANT_TYPES key);
    allow_requantize: `src` may hold quantized tensors (they are dequantized first)."""
    if gtype not in QUANT_TYPES:
        raise SystemExit(f"unknown quantizer mix {gtype!r}: expected one of {', '.join(QUANT_TYPES)}")
    print(f"quantizing {src.name} -> {out.name} with llama.cpp ...", flush=True)
    imatrix = json.dumps(uniform_imatrix(src) if gtype in IQUANTS else None)
    r = subprocess.run([py, "-c", QUANTIZE, str(src), str(out), QUANT_TYPES[gtype]]
                       + (["requantize"] if allow_requantize else []), capture_output=True, input=imatrix, text=True)
    if r.returncode:
        Path(f"{out}.partial").unlink(missing_ok=True)
        why = [ln.split("failed to quantize:", 1)[1].strip() for ln in r.stderr.splitlines() if "failed to quantize:" in ln]
        raise SystemExit(f"llama.cpp could not quantize {src.name} to {gtype}: "
                         + (why[-1] if why else r.stderr.strip()[-2000:]))
    return out


def type_mix(gguf_path: Path) -> tuple[str, float]:
    """("q5_0 x91, q6_k x7, ...": the tensor types of the file's matrices, most frequent first;
    bits per weight of those matrices as stored). The header is read with FreeToken's parser,
    which skips the vocabulary (gguf's GGUFReader takes ~10 s over a 262k-token one)."""
    import math
    from collections import Counter

    from gguf import GGMLQuantizationType

    from freetoken.weights.gguf.meta import read_header
    kinds: Counter = Counter()
    nbytes = nvals = 0
    for t in read_header(gguf_path, string_arrays=False).tensors.values():
        if len(t.shape) >= 2:
            kinds[GGMLQuantizationType(t.ggml_type).name.lower()] += 1
            nbytes, nvals = nbytes + t.nbytes, nvals + math.prod(t.shape)
    return ", ".join(f"{k} x{n}" for k, n in kinds.most_common()), 8 * nbytes / max(nvals, 1)
