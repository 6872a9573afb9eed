"""The device path's ggml experts: `torch_exec.run_slots` over packed cache slots (gather by
slot, dequantize by the slots' types on the device, bmm), per type and for a mix, on any torch
device. Prints per type the packed bytes of the experts one decode layer gathers, the time of
the call, the packed bytes/s that makes, and the same call on bf16 slots of the same experts
(what the slots would cost expanded: 2 bytes/weight) as a side-by-side ratio.

    .venv/bin/python bench/ggml_slots.py --threads 1                      # CPU, small shapes
    .venv/bin/python bench/ggml_slots.py --device cuda --hidden 2048 --inter 768 --k 8
    .venv/bin/python bench/ggml_slots.py --types Q4_K,IQ2_XXS,mix --tokens 1,4

"mix" is a slot bank whose experts' gate, up and down are in different types (Q2_K, IQ3_XXS,
Q6_K, ...): every gathered row is dequantized once per type of its half in the pool.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from freetoken.experts import ggml_slots
from freetoken.experts.execution.torch_exec import run_slots
from freetoken.experts.memory.pool import ExpertSpec
from freetoken.quant import ggml_iquants as iq
from freetoken.quant import ggml_quants as gq

MIX = ((gq.Q2_K, gq.Q2_K, gq.Q4_K), (iq.IQ3_XXS, iq.IQ3_XXS, gq.Q6_K), (gq.Q3_K, gq.Q3_K, iq.IQ2_XXS))


def slot_banks(trios, hidden: int, inter: int, device) -> dict[str, torch.Tensor]:
    """Random valid slots (small scales), expert i in trios[i % len(trios)]."""
    g = torch.Generator().manual_seed(0)
    n = len(trios)
    rows = lambda t, r, c: (iq.random_rows(t, r, c, g, scale=1e-3) if t in iq.TYPES  # noqa: E731
                            else gq.quantize(torch.randn(r, c, generator=g) * 0.02, t))
    banks = {}
    for half, (name, r, c) in enumerate((("gate", inter, hidden), ("up", inter, hidden), ("down", hidden, inter))):
        b = torch.zeros(n, r, max(gq.row_bytes(tr[half], c) for tr in trios), dtype=torch.uint8)
        for i, tr in enumerate(trios):
            b[i, :, :gq.row_bytes(tr[half], c)] = rows(tr[half], r, c)
        banks[name] = b
    banks.update(gate_up_types=torch.tensor([tr[:2] for tr in trios], dtype=torch.int32),
                 down_types=torch.tensor([[tr[2]] for tr in trios], dtype=torch.int32))
    return {k: v.to(device) for k, v in banks.items()}


def timed(fn, device, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--inter", type=int, default=256)
    ap.add_argument("--k", type=int, default=8, help="routed experts per token")
    ap.add_argument("--tokens", default="1")
    ap.add_argument("--types", default=",".join([gq.type_name(t) for t in gq.NAMES if t not in gq.FLOAT_TYPES] + ["mix"]))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    H, I, K = a.hidden, a.inter, a.k
    spec = ExpertSpec(H, I, "ggml")
    names = {v: k for k, v in gq.NAMES.items()}
    print(f"device {dev}, hidden {H}, intermediate {I}, {K} experts per token, torch {torch.__version__}")
    print(f"{'type':8} {'T':>3} {'packed MiB':>10} {'ms':>8} {'packed GB/s':>11} {'bf16 ms':>8} {'ggml/bf16':>9}")
    for name in a.types.split(","):
        trios = MIX if name == "mix" else ((names[name],) * 3,)
        banks = slot_banks([trios[i % len(trios)] for i in range(K)], H, I, dev)
        types = ggml_slots.bank_types(banks)
        packed = sum(b.nbytes for k, b in banks.items() if not k.endswith("types"))
        ids = torch.arange(K, device=dev)
        full = {"gate_up": ggml_slots.gather_dequant(banks, ids, "gate_up", H, I, types).to(torch.bfloat16),
                "down": ggml_slots.gather_dequant(banks, ids, "down", H, I, types).to(torch.bfloat16)}
        fspec = ExpertSpec(H, I, "float")
        for T in (int(x) for x in a.tokens.split(",")):
            slot_ids = torch.stack([torch.roll(ids, t)[:K] for t in range(T)])
            x = torch.randn(T, H, device=dev)
            w = torch.full((T, K), 1.0 / K, device=dev)
            out = torch.zeros(T, K, H, device=dev)
            s = timed(lambda: run_slots(banks, spec, slot_ids, x, w, out, types=types), dev, a.reps)
            sb = timed(lambda: run_slots(full, fspec, slot_ids, x, w, out), dev, a.reps)
            print(f"{name:8} {T:>3} {packed / 2**20:>10.2f} {s * 1e3:>8.2f} {packed / s / 1e9:>11.2f} "
                  f"{sb * 1e3:>8.2f} {s / sb:>9.2f}")


if __name__ == "__main__":
    main()
