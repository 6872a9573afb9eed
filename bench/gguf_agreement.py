"""GGUF agreement figures: llama.cpp's converter on tiny checkpoints of each family, our logits
vs the checkpoint (f32) or vs the checkpoint rounded as the GGUF stores it (bf16, q8_0),
on the exact torch expert path and on the ggml C kernels.
    .venv/bin/python bench/gguf_agreement.py [--archs qwen3_moe,...] [--types f32,bf16,q8_0]"""
import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "models"), str(ROOT / "tests" / "weights")]

from freetoken import LLM  # noqa: E402
from freetoken.tiny import make_tiny  # noqa: E402
from helpers import reference_logits  # noqa: E402
from llamacpp import convert, llama_cpp_source  # noqa: E402
from model_checks import ids_for  # noqa: E402
from test_gguf_models import CONVERT_ARGS, TINY, rounded_reference  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--archs", default="qwen3_moe,qwen2_moe,mixtral,olmoe,gpt_oss,qwen3_next,qwen3_5_moe,deepseek_v3,glm4_moe")
p.add_argument("--types", default="f32,bf16,q8_0")
a = p.parse_args()
src, root = llama_cpp_source(), Path(tempfile.mkdtemp())
print("| family | GGUF | torch experts vs reference | C kernels vs reference | reference vs f32 checkpoint |")
print("|---|---|---|---|---|")
for arch in a.archs.split(","):
    d = make_tiny(arch, root / arch, **TINY.get(arch, {}))
    ids = ids_for(29, seed=4)
    exact = reference_logits(d, ids)
    for t in a.types.split(","):
        g = convert(src, d, root / f"{arch}-{t}.gguf", t, *CONVERT_ARGS.get(arch, ()))
        ref = exact if t == "f32" else reference_logits(rounded_reference(d, g, root / f"ref-{arch}-{t}"), ids)
        s = max(1.0, ref.abs().max().item())
        rel = lambda x, y: (x - y).abs().max().item() / s  # noqa: E731
        torch_path = LLM(str(g), dtype="float32", moe_backend="resident").score(ids)
        kernels = LLM(str(g), dtype="float32").score(ids)
        print(f"| {arch} | {t} | {rel(torch_path, ref):.1e} | {rel(kernels, ref):.1e} | {rel(ref, exact):.1e} |",
              flush=True)
