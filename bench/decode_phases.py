"""Where one decode step of FreeToken goes, per phase, on the vs_llamacpp models (outside CI).

    .venv/bin/python bench/decode_phases.py [--formats bf16,q8_0,q4_k_m] [--prompt 512] [--steps 16]
                                            [--shape medium|medium48] [--threads 2] [--clock wall|process]
                                            [--speculative off]

After a P-token prefill, times `steps` single-sequence decode steps and splits each into:
experts (the C `ft_moe_run*` calls and their combine; `ft_moe_decode`, a decode step's top-k and
experts in one call; `ft_moe_row`, that plus the residual add on a decode row's reused rows), attention
(`ft_decode_attention`),
dense GEMVs (q/k/v/o projections; a one-row step's `ft_attn_half` is a phase of its own: its norms,
qkv, o and router GEMVs and attention in one call), router GEMVs and top-k, lm_head, norms + rope (C calls), and
the rest (Python, the scheduler, sampling; also as the median and 10th percentile step, which
a loaded machine stretches less than the mean). Dense and lm_head rows give the bytes they read per
step and the implied GB/s; a roofline line each token's bytes (bench/vs_llamacpp.py's count) as
a share of the read bandwidth. `--clock process` times CPU time instead of wall time: with
`--threads 1` a core's work per step, which a loaded machine stretches far less than the wall
clock. The model and options of each format are those of bench/vs_llamacpp.py."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import MEDIUM_QWEN3, fresh_prompts, medium_checkpoint  # noqa: E402
from vs_llamacpp import FORMATS, SHAPES, decode_costs, make_gguf  # noqa: E402
from freetoken.weights.gguf.reader import GgufFile  # noqa: E402
from llamacpp_setup import ensure_llamacpp  # noqa: E402

ACC: dict[str, float] = defaultdict(float)
BYTES: dict[str, int] = defaultdict(int)
ON = [False]
NOW = [time.perf_counter]     # --clock process: time.process_time (CPU time, for --threads 1 on a shared machine)
WRAPPED: set = set()
OTHER = [0.0, 0.0]    # per step, the time outside the timed calls: median, 10th percentile


def timed_c(lib, name: str, phase: str) -> None:
    """Wraps the ctypes function `name` of `lib` so its wall time counts to `phase` while ON."""
    fn = getattr(lib, name)

    def wrapper(*a):
        if not ON[0]:
            return fn(*a)
        t = NOW[0]()
        r = fn(*a)
        ACC[phase] += NOW[0]() - t
        return r
    setattr(lib, name, wrapper)


def timed_linear(n_experts: int, vocab: int) -> None:
    """Linear and GgmlLinear (a GGUF's packed dense layers) calls count to router / lm_head / dense."""
    from freetoken.layers.ggml_linear import GgmlLinear
    from freetoken.layers.linear import Linear
    for cls, nbytes in ((Linear, lambda m: m.weight.nbytes + (m.scales.nbytes if getattr(m, "scales", None) is not None
                                                                else 0)),
                        (GgmlLinear, lambda m: m.nbytes)):
        call = cls.__call__

        def wrapper(self, x, call=call, nbytes=nbytes):
            if not ON[0]:
                return call(self, x)
            phase = "router" if self.out_features == n_experts else "lm_head" if self.out_features == vocab else "dense"
            t = NOW[0]()
            r = call(self, x)
            ACC[phase] += NOW[0]() - t
            BYTES[phase] += nbytes(self)
            return r
        cls.__call__ = wrapper


def profile(source: Path, opts: dict, plen: int, steps: int, threads: int,
            par: int = 1, vocab: int = 8192) -> tuple[dict, float, float, dict]:
    from freetoken import LLM, SamplingParams
    llm = LLM(str(source), dtype="bfloat16", num_threads=threads, max_model_len=plen + steps + 64, max_num_seqs=par,
              **{"prefix_cache": False, **opts})
    from freetoken.kernels import cpu_kernels
    for lib in {id(x): x for x in (cpu_kernels(), *(p.lib for p in _pools()))}.values():
        for name, phase in (("ft_moe_run", "experts"), ("ft_moe_run_ranked", "experts"),
                            ("ft_moe_run_pairs", "experts"), ("ft_moe_combine", "experts"),
                            ("ft_moe_decode", "experts"),     # (with the decode step's top-k, ~1 us)
                            ("ft_moe_decode_add", "experts"),     # (and the residual add of one row, ~1 us)
                            ("ft_moe_row", "experts"),     # (the same, counting its experts: a decode row's own call)
                            ("ft_route_topk", "router"), ("ft_decode_attention", "attention"),
                            ("ft_rms_norm", "norm+rope"), ("ft_rope", "norm+rope"),
                            ("ft_add_rms_norm", "norm+rope"), ("ft_norm_rope_qk", "norm+rope"),
                            ("ft_kv_write", "attention"),
                            # a one-row step's attention half in one call: its norms, qkv/o GEMVs and attention
                            ("ft_attn_half", "attention half (norms, qkv/o/router GEMVs, attention)"),
                            # a one-row step's every layer in one call: the two above, layer by layer
                            ("ft_layers_row", "layers (attention halves + experts, one call)")):
            if (id(lib), name) not in WRAPPED and hasattr(lib, name):    # (an older tree's build lacks the fused calls)
                WRAPPED.add((id(lib), name))
                timed_c(lib, name, phase)
    g = dict(temperature=0.0, ignore_eos=True)
    warm, *prompts = fresh_prompts(1 + par, plen, vocab=(100, vocab - 100))
    llm.generate([warm[:32]], SamplingParams(max_tokens=2, **g))     # a warm-up no prompt shares a prefix with
    engine = llm.engine
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, SamplingParams(max_tokens=steps + 2, **g))
    started: set[str] = set()
    while len(started) < len(prompts):              # the prefills (and each first token)
        started.update(o.request_id for o in engine.step() if o.new_token_ids or o.finished)
    step_times, others, tokens = [], [], 0
    ON[0] = True
    while engine.has_unfinished():
        timed = sum(ACC.values())
        t = NOW[0]()
        outs = engine.step()
        step_times.append(NOW[0]() - t)
        others.append(step_times[-1] - (sum(ACC.values()) - timed))    # this step's time outside the timed calls
        tokens += sum(len(o.new_token_ids) for o in outs)
    ON[0] = False
    llm.close()
    n = len(step_times)
    phases = {k: v / n for k, v in ACC.items()}
    total = sum(step_times) / n
    phases["other (python, scheduler, top-k, sampling)"] = total - sum(phases.values())
    others.sort()      # a loaded machine stretches some steps: the median and the 10th percentile step
    OTHER[:] = [statistics.median(others), others[len(others) // 10]]
    return phases, total, statistics.median(step_times), {k: v // n for k, v in BYTES.items()}, tokens / n


def roofline_line(fmt: str, model: Path, context: int, seconds_per_token: float, read_bw: float) -> str:
    """A token's bytes (bench/vs_llamacpp.py's count: weights, top-k experts, bf16 KV at `context`)
    over its measured seconds, as a share of the read bandwidth; the KV's share of the bytes."""
    cfg = GgufFile(model).config if model.is_file() else json.loads((model / "config.json").read_text())
    phases = decode_costs(fmt, cfg, context, model if model.is_file() else None)
    total = sum(p.bytes for p in phases)
    kv = sum(p.bytes for p in phases if p.name.startswith("attention ("))
    return (f"roofline: {total / 1e6:.1f} MB a token (KV {kv / total:.1%}), bound {1e3 * total / read_bw:.2f} ms "
            f"at {read_bw / 1e9:.1f} GB/s: {total / seconds_per_token / read_bw:.0%} of the read bandwidth")


def _pools():
    """The kernel pools the engine holds (their libs may be another build variant)."""
    from freetoken.kernels.pool import CpuPool
    import gc
    return [o for o in gc.get_objects() if isinstance(o, CpuPool)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--formats", default="bf16,q8_0,q4_k_m")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--parallel", type=int, default=1, help="sequences decoding together (a step serves all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--experts", type=int, default=None, help="router GEMVs are the Linears this wide (default: the shape's)")
    ap.add_argument("--vocab", type=int, default=None, help="lm_head is the Linear this wide (default: the shape's)")
    ap.add_argument("--shape", default="medium", choices=list(SHAPES), help="the Qwen3-MoE formats' model (as bench/vs_llamacpp.py)")
    ap.add_argument("--speculative", default=None, help="the engine's speculative mode (default: the engine's, auto)")
    ap.add_argument("--ggml-numerics", default=None,
                    help="the GGUF formats' ggml_numerics (default: the engine's, auto; q8 / q8k force the k-quant "
                         "rows' decode activations per 32 / per 256)")
    ap.add_argument("--clock", choices=("wall", "process"), default="wall",
                    help="process: this process's CPU time (with --threads 1, a core's work whatever the load)")
    ap.add_argument("--decode-stack", choices=("on", "off"), default="on",
                    help="off: a one-row step's layers one by one (two calls a layer), not in one call")
    args = ap.parse_args()
    if args.decode_stack == "off":
        from freetoken.layers.attention import decode_stack
        decode_stack.STACK[0] = False
    NOW[0] = time.process_time if args.clock == "process" else time.perf_counter
    torch.set_num_threads(args.threads)
    from freetoken.experts.measure.membw import read_bandwidth
    # the read bandwidth on the steps' clock (thread CPU time for --clock process: one core's rate whatever the load)
    read_bw = read_bandwidth(1 << 28, repeats=5, num_threads=args.threads,
                             clock="thread" if args.clock == "process" else "wall")
    print(f"read bandwidth ({args.threads} threads, {args.clock} clock): {read_bw / 1e9:.1f} GB/s", flush=True)
    shape = SHAPES[args.shape][1] if SHAPES[args.shape] else MEDIUM_QWEN3
    timed_linear(args.experts or shape["experts"], args.vocab or shape["vocab"])
    for fmt in args.formats.split(","):
        build, gtype, source, opts = FORMATS[fmt]
        opts = {**opts, "speculative": args.speculative} if args.speculative else opts
        if args.ggml_numerics and source == "gguf":
            opts = {**opts, "ggml_numerics": args.ggml_numerics}
        model = medium_checkpoint(name=SHAPES[args.shape][0], **shape) if SHAPES[args.shape] and build is medium_checkpoint else build()
        if source == "gguf":            # only the GGUF formats need llama.cpp (its converter, its quantizer)
            model = make_gguf(*ensure_llamacpp(), model, gtype)
        ACC.clear(), BYTES.clear()
        phases, total, med, nbytes, per_step = profile(model, opts, args.prompt, args.steps, args.threads,
                                                         args.parallel, shape["vocab"])
        print(f"\n{fmt} ({model.name}, {opts or 'defaults'}), context {args.prompt}, {args.parallel} seq, {args.steps} steps: "
              f"{total * 1e3:.2f} ms/step mean, {med * 1e3:.2f} median, {per_step:.2f} tokens a step "
              f"({per_step / total:.1f} tok/s aggregate)")
        if args.parallel == 1:
            print("  " + roofline_line(fmt, model, args.prompt, total / per_step, read_bw))
        print(f"  other per step: median {OTHER[0] * 1e3:.2f} ms, 10th percentile {OTHER[1] * 1e3:.2f} ms")
        for k, v in sorted(phases.items(), key=lambda kv: -kv[1]):
            bw = f"   {nbytes[k] / 1e6:7.1f} MB  {nbytes[k] / v / 1e9:5.1f} GB/s" if nbytes.get(k) and v > 0 else ""
            print(f"  {k:45}{v * 1e3:8.2f} ms {v / total:6.1%}{bw}")


if __name__ == "__main__":
    main()
