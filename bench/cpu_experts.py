"""B_H of the CPU expert kernels per weight format, next to the machine's read bandwidth and
next to torch baselines run on the same shapes in the same process, printing ratios.

    .venv/bin/python bench/cpu_experts.py                       # all formats, decode (1 token)
    .venv/bin/python bench/cpu_experts.py --formats bf16,int8 --tokens 1,4 --seconds 1
    .venv/bin/python bench/cpu_experts.py --per-core   # 1 thread, CPU-time clock (shared machines)
    .venv/bin/python bench/cpu_experts.py --formats int8,mxfp4 --isa native,avx2 --per-core   # VNNI vs AVX2
    .venv/bin/python bench/cpu_experts.py --formats bf16 --tokens 1,2,4,8 --bf16-dot off,on --per-core --no-torch

B_H = bytes of expert weights (and scales) of the distinct experts a call touches / call time;
routes are fresh random top-k sets over --experts experts (banks far larger than the caches).
Torch baselines (per expert, like transformers' eager MoE loop):
  fp32/bf16/fp16  F.linear on the bank rows;   int8  torch._weight_int8pack_mm (per-channel int8);
  mxfp4, nvfp4    torch._weight_int4pack_mm_for_cpu (int4, group 32) as the nearest 4-bit op;
  fp8             dequantize + F.linear (torch has no CPU fp8 matmul).
"""
from __future__ import annotations

import argparse
import torch
import torch.nn.functional as F

from freetoken.experts.execution.cpu import CpuExpertExecutor
from freetoken.experts.formats import quantize_banks
from freetoken.experts.measure.membw import CLOCKS, expert_nbytes, measure_expert_bandwidth, read_bandwidth, torch_read_bandwidth
from freetoken.quant.fp8 import dequantize_fp8_block


def build_banks(fmt: str, n: int, hidden: int, inter: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    parts = []
    for i in range(0, n, 4):
        m = min(4, n - i)
        parts.append(quantize_banks(torch.randn(m, 2 * inter, hidden, generator=g) * 0.02,
                                    torch.randn(m, hidden, inter, generator=g) * 0.02, fmt))
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


class TorchBaseline:
    """Per-expert torch ops on the same shapes; returns (callable(x, ids), bytes per expert)."""

    def __init__(self, fmt: str, banks: dict[str, torch.Tensor], hidden: int, inter: int):
        self.fmt, self.I = fmt, inter
        n = next(iter(banks.values())).shape[0]
        if fmt in ("fp32", "bf16", "fp16"):
            self.gu, self.dn = banks["gate_up"], banks["down"]
            self.nbytes = self.gu[0].nbytes + self.dn[0].nbytes
            self.name = f"torch F.linear {fmt}"
        elif fmt == "int8":   # per-channel int8 weights (torch's only int8 weight-only CPU op)
            self.gu = banks["gate_up"]
            self.dn = banks["down"]
            self.gus = torch.rand(n, 2 * inter) * 1e-3
            self.dns = torch.rand(n, hidden) * 1e-3
            self.nbytes = self.gu[0].nbytes + self.dn[0].nbytes + self.gus[0].nbytes + self.dns[0].nbytes
            self.name = "torch _weight_int8pack_mm"
        elif fmt in ("mxfp4", "nvfp4"):  # int4 group-32 packed weights (torch has no e2m1 op)
            self.gu = torch.stack([torch._convert_weight_to_int4pack_for_cpu(
                torch.randint(0, 16, (2 * inter, hidden), dtype=torch.int32), 1) for _ in range(n)])
            self.dn = torch.stack([torch._convert_weight_to_int4pack_for_cpu(
                torch.randint(0, 16, (hidden, inter), dtype=torch.int32), 1) for _ in range(n)])
            self.gus = torch.rand(n, hidden // 32, 2 * inter, 2) * 1e-3
            self.dns = torch.rand(n, inter // 32, hidden, 2) * 1e-3
            self.nbytes = self.gu[0].nbytes + self.dn[0].nbytes + self.gus[0].nbytes + self.dns[0].nbytes
            self.name = "torch _weight_int4pack_mm_for_cpu"
        else:                 # fp8: dequantize then matmul
            self.banks = banks
            self.nbytes = sum(banks[k][0].nbytes for k in ("gate_up", "gate_up_scale_inv", "down", "down_scale_inv"))
            self.name = "torch dequant+F.linear fp8"

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        I = self.I
        if self.fmt in ("fp32", "bf16", "fp16"):
            xx = x.to(self.gu.dtype)
            h = F.linear(xx, self.gu[e])
            return F.linear(F.silu(h[:, :I]) * h[:, I:], self.dn[e]).float()
        if self.fmt == "int8":
            h = torch._weight_int8pack_mm(x, self.gu[e], self.gus[e])
            return torch._weight_int8pack_mm((F.silu(h[:, :I]) * h[:, I:]).contiguous(), self.dn[e], self.dns[e])
        if self.fmt in ("mxfp4", "nvfp4"):
            h = torch._weight_int4pack_mm_for_cpu(x, self.gu[e], 32, self.gus[e])
            return torch._weight_int4pack_mm_for_cpu((F.silu(h[:, :I]) * h[:, I:]).contiguous(), self.dn[e], 32, self.dns[e])
        b = self.banks
        h = F.linear(x, dequantize_fp8_block(b["gate_up"][e], b["gate_up_scale_inv"][e]))
        return F.linear(F.silu(h[:, :I]) * h[:, I:], dequantize_fp8_block(b["down"][e], b["down_scale_inv"][e]))

    def bandwidth(self, n: int, hidden: int, tokens: int, top_k: int, seconds: float, clock: str = "wall") -> float:
        now = CLOCKS[clock]
        g = torch.Generator().manual_seed(1)
        x = torch.randn(tokens, hidden, generator=g)
        self.expert(0, x)
        total_b, total_t, it = 0, 0.0, 0
        while it < 3 or total_t < seconds:
            experts = torch.randperm(n, generator=g)[:top_k].tolist()
            t0 = now()
            out = torch.zeros(tokens, hidden)
            for e in experts:
                out += self.expert(e, x)
            total_t += now() - t0
            total_b += len(experts) * self.nbytes
            it += 1
        return total_b / total_t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--formats", default="bf16,fp8,int8,mxfp4,nvfp4,fp16,fp32")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--experts", type=int, default=32, help="experts in the bank (bank >> L3)")
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--tokens", default="1", help="comma list; tokens share the same top-k set sizes")
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-torch", action="store_true", help="skip the torch baselines")
    ap.add_argument("--isa", default="native", help="comma list of kernel variants: native, avx2, portable")
    ap.add_argument("--bf16-dot", default="off",
                    help="comma list for bf16 banks: off (fp32 activations), on (vdpbf16ps, bf16 activations)")
    ap.add_argument("--per-core", action="store_true",
                    help="one thread everywhere, timed by the thread's CPU clock (robust on shared machines)")
    a = ap.parse_args()
    clock = "thread" if a.per_core else "wall"
    if a.per_core:
        a.threads = 1
    torch.set_num_threads(a.threads or torch.get_num_threads())

    rb = read_bandwidth(num_threads=a.threads, clock=clock)
    tb = torch_read_bandwidth(clock=clock)
    print(f"read bandwidth: kernel pool {rb / 1e9:.1f} GB/s, torch.sum {tb / 1e9:.1f} GB/s "
          f"(threads: {a.threads or 'one per core'}, torch {torch.get_num_threads()}, clock {clock})")
    print(f"shapes: hidden {a.hidden}, intermediate {a.inter}, {a.experts} experts, top-{a.top_k}")
    print(f"{'format':7s} {'tok':>3s} {'isa':11s} {'B/weight':>8s} {'B_H GB/s':>9s} {'/read':>6s}  "
          f"{'torch GB/s':>10s} {'ours/torch':>10s}  torch baseline")
    for fmt in a.formats.split(","):
        banks = build_banks(fmt, a.experts, a.hidden, a.inter)
        base = None if a.no_torch else TorchBaseline(fmt, banks, a.hidden, a.inter)
        runs = [(isa, dot) for isa in a.isa.split(",") for dot in (a.bf16_dot.split(",") if fmt == "bf16" else ["off"])]
        for isa, dot in runs:
            ex = CpuExpertExecutor(banks, fmt, a.hidden, a.inter, num_threads=a.threads, isa=isa)
            mode = ex.lib.ft_set_bf16_dot(int(dot == "on")) if ex.lib is not None else 0
            label = ex.isa + {0: "", 1: " dot(emul)", 2: " dot"}[mode]
            per_w = expert_nbytes(ex) / (3 * a.hidden * a.inter)
            for t in [int(v) for v in a.tokens.split(",")]:
                bh = measure_expert_bandwidth(ex, tokens=t, top_k=a.top_k, seconds=a.seconds, clock=clock)
                line = f"{fmt:7s} {t:3d} {label:11s} {per_w:8.3f} {bh / 1e9:9.1f} {bh / rb:6.2f}"
                if base is not None:
                    tbh = base.bandwidth(a.experts, a.hidden, t, a.top_k, a.seconds, clock)
                    line += f"  {tbh / 1e9:10.1f} {bh / tbh:10.2f}  {base.name}"
                print(line, flush=True)
            if ex.lib is not None:
                ex.lib.ft_set_bf16_dot(0)
            ex.close()
        del banks, base


if __name__ == "__main__":
    main()
