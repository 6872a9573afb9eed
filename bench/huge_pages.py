"""A decode GEMV's weights streamed from 4 KiB vs 2 MiB pages, side by side (outside CI).

    .venv/bin/python bench/huge_pages.py [--mib 512] [--threads 1,2] [--rounds 7] [--clock wall|thread]
    .venv/bin/python bench/huge_pages.py --engine [--shape medium|medium48] [--threads 1] [--clock process]

One [N, 4096] bf16 weight of --mib MiB (far beyond the caches) in two copies: torch.empty's memory
(4 KiB pages under THP `madvise`) and kernels/huge_pages.py's (2 MiB pages, as the loader now
places expert banks and kernel-streamed Linear weights). Per pool size, alternating rounds: the
roofline's read probe (ft_read_bytes, what `freetoken check --roofline` calls the read bandwidth)
and the Linear's one-token decode GEMV (vdpbf16ps where the build has it) over each copy; GB/s
best and median of the rounds and the 2 MiB / 4 KiB ratio of the medians. --clock thread: the
calling thread's CPU time (the pool's worker 0; for --threads 1 on a loaded machine).

--engine: two engines over bench/vs_llamacpp.py's bf16 checkpoint in one process, one built with
huge pages off (kernels/huge_pages.ON), one on; alternating rounds of a 512-token prompt and 32
single-sequence decode steps each, the median step (--clock process: this process's CPU time)."""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import MEDIUM_QWEN3, fresh_prompts, medium_checkpoint  # noqa: E402
from vs_llamacpp import SHAPES  # noqa: E402
from freetoken import kernels  # noqa: E402
from freetoken.kernels import huge_pages  # noqa: E402
from freetoken.kernels.huge_pages import huge_empty  # noqa: E402
from freetoken.kernels.pool import CpuPool  # noqa: E402
from freetoken.layers.linear import Linear  # noqa: E402


def huge_kib(t: torch.Tensor) -> int:
    """AnonHugePages (kB) of the mapping that holds `t` (/proc/self/smaps)."""
    addr, inside = t.data_ptr(), False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def engines(shape: str, threads: int, rounds: int, clock) -> None:
    """Median decode step of an engine on small pages and one on huge pages, alternating rounds."""
    from freetoken import LLM, SamplingParams
    source = medium_checkpoint(name=SHAPES[shape][0], **SHAPES[shape][1]) if SHAPES[shape] else medium_checkpoint()
    built = {}
    for name, on in (("4 KiB", False), ("2 MiB", True)):
        huge_pages.ON[0] = on
        built[name] = LLM(str(source), dtype="bfloat16", num_threads=threads, max_model_len=700,
                          prefix_cache=False, speculative="off")
    huge_pages.ON[0] = True
    vocab = (SHAPES[shape][1] if SHAPES[shape] else MEDIUM_QWEN3)["vocab"]
    prompts = iter(fresh_prompts(2 * rounds, 512, vocab=(100, vocab - 100)))
    steps = {name: [] for name in built}
    for _ in range(rounds):
        for name, llm in built.items():
            engine = llm.engine
            engine.add_request("r", next(prompts), SamplingParams(max_tokens=33, temperature=0.0, ignore_eos=True))
            engine.step()                                   # the prefill and the first token
            times = []
            while engine.has_unfinished():
                t = clock()
                engine.step()
                times.append(clock() - t)
            steps[name].append(1e3 * statistics.median(times))
    med = {name: statistics.median(v) for name, v in steps.items()}
    for name, v in steps.items():
        print(f"{shape} bf16, {threads} thread(s), {name} pages: median step {med[name]:.2f} ms (rounds "
              + ", ".join(f"{x:.1f}" for x in v) + ")")
    print(f"huge pages: {med['4 KiB'] / med['2 MiB']:.3f}x the decode speed")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--clock", choices=("wall", "thread", "process"), default="wall")
    ap.add_argument("--engine", action="store_true", help="two engines' decode steps, small vs huge pages")
    ap.add_argument("--shape", default="medium", choices=list(SHAPES))
    args = ap.parse_args()
    clock = {"thread": time.thread_time, "process": time.process_time}.get(args.clock, time.perf_counter)
    if args.engine:
        torch.set_num_threads(int(args.threads.split(",")[0]))
        return engines(args.shape, int(args.threads.split(",")[0]), args.rounds, clock)
    K = 4096
    N = (args.mib << 20) // (2 * K)
    w = torch.randn(N, K).bfloat16()
    copies = {"4 KiB": torch.empty(N, K, dtype=torch.bfloat16), "2 MiB": huge_empty((N, K), torch.bfloat16)}
    for c in copies.values():
        c.copy_(w)
    del w
    print(f"{N} x {K} bf16 ({args.mib} MiB); AnonHugePages: "
          + ", ".join(f"{name} {huge_kib(c) >> 10} MiB" for name, c in copies.items()), flush=True)
    lib = kernels.cpu_kernels()
    print(f"bf16 dots: {'vdpbf16ps' if lib.ft_set_bf16_dot(1) == 2 else 'emulated'}; clock {args.clock}")
    x = torch.randn(1, K)
    for n in (int(t) for t in args.threads.split(",")):
        pool = CpuPool(lib, n)
        lin = Linear(copies["2 MiB"][:1].float(), None, compute_dtype=torch.float32,
                     storage_dtype=torch.bfloat16, pool=pool)
        rates = {(kind, name): [] for kind in ("read probe", "GEMV") for name in copies}
        for _ in range(args.rounds):
            for name, c in copies.items():
                lin.weight, lin.out_features = c, N        # (the Linear recomputes its kernel arguments)
                for kind, run in (("read probe", lambda: lib.ft_read_bytes(pool.handle, c.data_ptr(), c.nbytes)),
                                  ("GEMV", lambda: lin(x))):
                    run()
                    t = clock()
                    run()
                    rates[kind, name].append(c.nbytes / (clock() - t) / 1e9)
        for kind in ("read probe", "GEMV"):
            med = {name: statistics.median(rates[kind, name]) for name in copies}
            print(f"{n} thread(s) {kind:10} " + "  ".join(
                f"{name}: best {max(rates[kind, name]):5.1f} median {med[name]:5.1f} GB/s" for name in copies)
                  + f"  ratio {med['2 MiB'] / med['4 KiB']:.2f}x", flush=True)
        pool.close()
    lib.ft_set_bf16_dot(0)


if __name__ == "__main__":
    main()
