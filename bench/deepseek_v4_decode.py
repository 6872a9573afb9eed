"""DeepSeek-V4 decode on the CPU: tok/s and share of the memory roofline.

    .venv/bin/python bench/deepseek_v4_decode.py [--threads 2] [--prompt 512] [--decode 32]

A medium random model with V4-Flash's layout at smaller width (see MEDIUM_V4), written in
V4-Flash's format: FP8 e4m3 projections with UE8M0 block scales, FP4 (MXFP4) routed experts.
Bytes per decoded token = every dense weight (as stored) + top-k experts per layer + the
window and compressed entries read; roofline tok/s = measured read bandwidth / that."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import fresh_prompts, medium_checkpoint, set_threads  # noqa: E402
from decode_prefill import rates  # noqa: E402

# V4-Flash per layer: hidden 4096, 64 heads x 512, q_lora 1024, 8 output groups x 1024, 256
# experts top-6 (I=2048), indexer 64 x 128 top-512, window 128, CSA rate 4, HCA rate 128, 4
# streams. Here half the width, 32 experts, 4 layers (sliding, CSA, HCA, CSA): ~0.7 GB stored.
MEDIUM_V4 = dict(layers=4, experts=32, top_k=6, hidden=2048, vocab=8192, num_attention_heads=32, head_dim=256,
                 q_lora_rank=512, o_groups=4, o_lora_rank=512, moe_intermediate_size=1024, index_n_heads=32,
                 index_head_dim=64, index_topk=64, sliding_window=128, hc_mult=4, partial_rotary_factor=0.25,
                 compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
                 layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                              "compressed_sparse_attention"],
                 mlp_layer_types=["hash_moe", "moe", "moe", "moe"], max_position_embeddings=4096)


def linears(obj, seen=None):
    """Every Linear reachable from obj's attributes (lists included), once."""
    from freetoken.layers.linear import Linear
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, Linear):
        yield obj
        return
    items = obj if isinstance(obj, (list, tuple)) else getattr(obj, "__dict__", {}).values()
    for v in items:
        if isinstance(v, (list, tuple)) or hasattr(v, "__dict__") and type(v).__module__.startswith("freetoken"):
            yield from linears(v, seen)


def bytes_per_token(model, context: int) -> int:
    dense = sum(lin.weight.nbytes + (lin.scales.nbytes if lin.scales is not None else 0) + 
                (lin.bias.nbytes if lin.bias is not None else 0) for lin in linears(model.layers + [model.lm_head]))
    experts = model.pool.expert_nbytes * model.top_k() * len(model.layers)
    row = model.c["head_dim"] * torch.finfo(model.kv_dtype).bits // 8
    state = 0
    for i, t in enumerate(model.layer_types):
        state += min(context, model.c["sliding_window"]) * row
        if t != "sliding_attention":
            rate = model.c["compress_rates"][t]
            state += context // rate * row
            if t == "compressed_sparse_attention":
                state += context // rate * model.c["index_head_dim"] * torch.finfo(model.kv_dtype).bits // 8
    return dense + experts + model.hidden * 2 + state


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds, fresh prompts each (medians reported)")
    args = ap.parse_args()
    set_threads(args.threads)
    from freetoken import LLM, SamplingParams
    from freetoken.experts.measure.membw import read_bandwidth
    d = medium_checkpoint("deepseek_v4_fp4", "deepseek-v4-medium", initializer_range=0.02, **MEDIUM_V4)
    prompts = fresh_prompts(1 + 2 * args.rounds, args.prompt)
    llm = LLM(str(d), dtype="bfloat16", num_threads=args.threads, max_model_len=4096, prefix_cache=False)
    greedy = dict(temperature=0.0, ignore_eos=True)

    def generate(p, n):
        return llm.generate([p], SamplingParams(max_tokens=n, **greedy))[0].token_ids
    prefill, decode, _ = rates(prompts, args.decode, lambda p: generate(p, 1), generate)
    model = llm.engine.model
    nbytes = bytes_per_token(model, args.prompt + args.decode // 2)
    llm.close()
    bw = read_bandwidth(num_threads=args.threads)
    roof = bw / nbytes
    print(f"model {d.name} ({sum(f.stat().st_size for f in d.glob('*.safetensors')) / 2**30:.2f} GiB stored), "
          f"{args.threads} threads, prompt {args.prompt}, decode {args.decode}, median of {args.rounds} rounds, "
          "fresh prompts, no prefix cache")
    print(f"prefill {prefill:.1f} tok/s, decode {decode:.2f} tok/s")
    print(f"bytes read per decoded token {nbytes / 2**20:.1f} MiB, read bandwidth {bw / 1e9:.1f} GB/s, "
          f"roofline {roof:.1f} tok/s, decode at {100 * decode / roof:.0f}% of it")


if __name__ == "__main__":
    main()
