"""A GGUF requantized by llama.cpp's own quantizer (bench/llamacpp_quantize.py, what
`bench/quality.py --formats` runs on a real model's file): llama.cpp refuses an already
quantized file unless allow_requantize is set, and the file it makes runs in FreeToken as its
tensors say. The reference is transformers on the checkpoint with every tensor replaced by the
file's own, dequantized by the `gguf` package (a requantized tensor is rounded twice, so the
checkpoint rounded once to the final type would not be what the file holds)."""
from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from freetoken import LLM
from freetoken.weights.gguf.names import hf_name

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from helpers import assert_logits_close, reference_logits  # noqa: E402
from llamacpp_quantize import quantize, type_mix  # noqa: E402
from model_checks import ids_for  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                reason="llama-cpp-python not installed (its quantizer makes the files)")


def file_weights(model_dir: Path, gguf_path: Path, out: Path) -> Path:
    """A copy of the checkpoint holding the GGUF's tensors, dequantized by gguf-py (qwen3: the
    converter stores q/k unpermuted)."""
    import gguf
    arrays = {}
    for t in gguf.GGUFReader(str(gguf_path)).tensors:
        w = np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        arrays[hf_name("qwen3", t.name)] = torch.from_numpy(w.reshape(tuple(int(d) for d in reversed(t.shape))))
    shutil.copytree(model_dir, out)
    for f in out.glob("*.safetensors"):
        tensors = load_file(str(f))
        assert set(tensors) <= set(arrays), set(tensors) - set(arrays)
        save_file({k: arrays[k].to(v.dtype).reshape(v.shape) for k, v in tensors.items()}, str(f))
    return out


def test_requantized_q8_0_file_runs_as_its_tensors_say(tiny_dir, to_gguf, tmp_path):
    d = tiny_dir("qwen3")
    src = to_gguf(d, "q8_0")
    py = Path(sys.executable)
    with pytest.raises(SystemExit, match="requantizing from type q8_0 is disabled"):
        quantize(py, src, tmp_path / "refused.gguf", "q4_0")
    assert not list(tmp_path.glob("refused.gguf*"))
    out = quantize(py, src, tmp_path / "q4_0.gguf", "q4_0", allow_requantize=True)
    mix, bits = type_mix(out)
    assert mix.startswith("q4_0") and 4.0 < bits < 8.5, (mix, bits)
    ids = ids_for(29, seed=4)
    ref = reference_logits(file_weights(d, out, tmp_path / "ref"), ids)
    exact = LLM(str(out), dtype="float32", dense_format="float").score(ids)     # dequantized at load
    assert_logits_close(exact, ref)
    # packed (ggml's int8-activation dots): within a quarter of what the weights' rounding costs
    packed = LLM(str(out), dtype="float32").score(ids)
    weights_err = (ref - reference_logits(d, ids)).abs().max().item()
    assert (packed - ref).abs().max().item() <= max(1e-4 * ref.abs().max().item(), 0.25 * weights_err)
