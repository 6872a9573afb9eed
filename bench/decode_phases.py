"""Where one decode step of FreeToken goes, per phase, on the vs_llamacpp models (outside CI).

    .venv/bin/python bench/decode_phases.py [--formats bf16,q8_0,q4_k_m] [--prompt 512] [--steps 16]

After a P-token prefill, times `steps` single-sequence decode steps and splits each into:
experts (the C `ft_moe_run` calls), attention (`ft_decode_attention`), dense GEMVs (q/k/v/o
projections), router GEMVs, lm_head, norms + rope (C calls), and the rest (Python, the scheduler,
router top-k, sampling). Dense and lm_head rows give the bytes they read per step and the implied
GB/s. The model and options of each format are those of bench/vs_llamacpp.py."""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import fresh_prompts  # noqa: E402
from vs_llamacpp import FORMATS, make_gguf  # noqa: E402
from llamacpp_setup import ensure_llamacpp  # noqa: E402

ACC: dict[str, float] = defaultdict(float)
BYTES: dict[str, int] = defaultdict(int)
ON = [False]
WRAPPED: set = set()


def timed_c(lib, name: str, phase: str) -> None:
    """Wraps the ctypes function `name` of `lib` so its wall time counts to `phase` while ON."""
    fn = getattr(lib, name)

    def wrapper(*a):
        if not ON[0]:
            return fn(*a)
        t = time.perf_counter()
        r = fn(*a)
        ACC[phase] += time.perf_counter() - t
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
            t = time.perf_counter()
            r = call(self, x)
            ACC[phase] += time.perf_counter() - t
            BYTES[phase] += nbytes(self)
            return r
        cls.__call__ = wrapper


def profile(source: Path, opts: dict, plen: int, steps: int, threads: int,
            par: int = 1) -> tuple[dict, float, float, dict]:
    from freetoken import LLM, SamplingParams
    llm = LLM(str(source), dtype="bfloat16", num_threads=threads, max_model_len=plen + steps + 64, max_num_seqs=par,
              **{"prefix_cache": False, **opts})
    from freetoken.kernels import cpu_kernels
    for lib in {id(x): x for x in (cpu_kernels(), *(p.lib for p in _pools()))}.values():
        for name, phase in (("ft_moe_run", "experts"), ("ft_decode_attention", "attention"),
                            ("ft_rms_norm", "norm+rope"), ("ft_rope", "norm+rope")):
            if (id(lib), name) not in WRAPPED:
                WRAPPED.add((id(lib), name))
                timed_c(lib, name, phase)
    g = dict(temperature=0.0, ignore_eos=True)
    warm, *prompts = fresh_prompts(1 + par, plen)
    llm.generate([warm[:32]], SamplingParams(max_tokens=2, **g))     # a warm-up no prompt shares a prefix with
    engine = llm.engine
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, SamplingParams(max_tokens=steps + 2, **g))
    started: set[str] = set()
    while len(started) < len(prompts):              # the prefills (and each first token)
        started.update(o.request_id for o in engine.step() if o.new_token_ids or o.finished)
    step_times = []
    ON[0] = True
    while engine.has_unfinished():
        t = time.perf_counter()
        engine.step()
        step_times.append(time.perf_counter() - t)
    ON[0] = False
    llm.close()
    n = len(step_times)
    phases = {k: v / n for k, v in ACC.items()}
    total = sum(step_times) / n
    phases["other (python, scheduler, top-k, sampling)"] = total - sum(phases.values())
    return phases, total, statistics.median(step_times), {k: v // n for k, v in BYTES.items()}


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
    ap.add_argument("--experts", type=int, default=64, help="router GEMVs are the Linears this wide")
    ap.add_argument("--vocab", type=int, default=8192, help="lm_head is the Linear this wide")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    timed_linear(args.experts, args.vocab)
    for fmt in args.formats.split(","):
        build, gtype, source, opts = FORMATS[fmt]
        model = build()
        if source == "gguf":            # only the GGUF formats need llama.cpp (its converter, its quantizer)
            model = make_gguf(*ensure_llamacpp(), model, gtype)
        ACC.clear(), BYTES.clear()
        phases, total, med, nbytes = profile(model, opts, args.prompt, args.steps, args.threads,
                                               args.parallel)
        print(f"\n{fmt} ({model.name}, {opts or 'defaults'}), context {args.prompt}, {args.parallel} seq, {args.steps} steps: "
              f"{total * 1e3:.2f} ms/step mean, {med * 1e3:.2f} median ({args.parallel / total:.1f} tok/s aggregate)")
        for k, v in sorted(phases.items(), key=lambda kv: -kv[1]):
            bw = f"   {nbytes[k] / 1e6:7.1f} MB  {nbytes[k] / v / 1e9:5.1f} GB/s" if nbytes.get(k) and v > 0 else ""
            print(f"  {k:45}{v * 1e3:8.2f} ms {v / total:6.1%}{bw}")


if __name__ == "__main__":
    main()
