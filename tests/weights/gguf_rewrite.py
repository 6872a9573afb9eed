"""Re-write a GGUF with gguf.GGUFWriter: same metadata, chosen tensors re-quantized (our
ggml_quants quantizer: llama.cpp's python converter cannot write k-quants, and llama-quantize
needs a C++ build), optionally split into parts as gguf-split makes them."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import gguf
import numpy as np
import torch

from freetoken.quant import ggml_quants

T = gguf.GGUFValueType


def _value(field):
    v = field.contents()
    if field.types[0] == T.ARRAY:
        return v, T.ARRAY, field.types[-1]
    return v, field.types[0], None


def rewrite(src: Path, dst: Path, type_of: Callable[[str, tuple], int | None] = lambda n, s: None,
            split_max_tensors: int = 0, set_keys: dict[str, str | int] | None = None) -> Path:
    """dst (first part if split) from src; type_of(gguf name, shape) -> ggml type or None to keep;
    `set_keys`: metadata to set, strings or uint32 (e.g. tokenizer.chat_template)."""
    set_keys = dict(set_keys or {})
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch, split_max_tensors=split_max_tensors)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment") or key.startswith("split."):
            continue
        val, vtype, sub = _value(field)
        if key in set_keys:
            continue
        w.add_key_value(key, val, vtype, sub_type=sub)
    for key, val in set_keys.items():
        w.add_key_value(key, val, T.STRING if isinstance(val, str) else T.UINT32)
    for t in reader.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        want = type_of(t.name, shape)
        if want is None or want == t.tensor_type:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)     # byte shape for quantized types
            continue
        x = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)).reshape(shape)
        q = ggml_quants.quantize(x, want).numpy()
        w.add_tensor(t.name, q, raw_dtype=gguf.GGMLQuantizationType(want))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if split_max_tensors:
        return next(Path(dst).parent.glob(f"{Path(dst).stem}-00001-of-*.gguf"))
    return Path(dst)


def q4_k_m(name: str, shape: tuple) -> int | None:
    """A Q4_K_M-like mix: Q6_K for attn_v / ffn_down (of every other layer) and the output,
    Q4_K for the other 2-D weights; norms, routers and 1-D tensors stay as they are."""
    if len(shape) < 2 or shape[-1] % 256 or "norm" in name or "ffn_gate_inp" in name or name.endswith(".bias"):
        return None
    layer = int(name.split(".")[1]) if name.startswith("blk.") else 0
    if name.startswith("output.") or ".attn_v." in name or ("ffn_down" in name and layer % 2 == 0):
        return ggml_quants.Q6_K
    return ggml_quants.Q4_K
