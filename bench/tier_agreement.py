"""Tier agreement per position: logits of `resident` / `offload` / `hybrid` against `cpu` on a tiny
bf16 Qwen3-MoE, per expert format and prefill-GEMM precision, as a fraction of the logit scale.
Shows where the rounding points are (docs/expert-memory.md, "One answer on every tier").

    PYTHONPATH=. python bench/tier_agreement.py
"""
from __future__ import annotations

import tempfile

from freetoken import LLM
from freetoken.experts.execution import numerics
from freetoken.tiny import make_tiny

PROMPT = list(range(5, 45))
CASES = ((None, "float32"), (None, "bfloat16"), ("int8", "bfloat16"), ("nvfp4", "bfloat16"), ("ggml", "bfloat16"))


def main() -> None:
    model = make_tiny("qwen3_moe", tempfile.mkdtemp() + "/m", dtype="bfloat16", layers=2, experts=8, top_k=2)
    print("| experts | prefill GEMM | tier | max diff / scale | positions > 1e-5 |\n|---|---|---|---|---|")
    for fmt, gemm in CASES:
        res = {}
        for backend, slots in (("cpu", None), ("resident", None), ("offload", 5), ("hybrid", 5)):
            llm = LLM(str(model), dtype="bfloat16", prefill_gemm=gemm, moe_backend=backend, expert_cache_slots=slots,
                      expert_format=fmt, expert_cache_policy="lru")
            res[backend] = llm.score(PROMPT).double()
            llm.close()
        ref = res.pop("cpu")
        for tier, logits in res.items():
            per = (logits - ref).abs().amax(-1) / ref.abs().max()
            print(f"| {fmt or 'bf16'} | {gemm} | {tier} | {per.max().item():.2e} | {int((per > 1e-5).sum())}/{len(per)} |")
    print(f"bf16 dots (this machine's choice): {numerics.bf16_dot()}")


if __name__ == "__main__":
    main()
