"""Weights on 2 MiB pages (kernels/huge_pages.py): the memory is what torch.empty gives (shape,
dtype, contiguous, writable, kept alive by the tensor) at a 2 MiB boundary with the kernel's
huge-page advice on its mapping; copies are exact; and the kernels' GEMV over a Linear and an
expert bank built on it computes the float64 reference in every kernel build this CPU runs."""
import gc
from pathlib import Path

import pytest
import torch

from freetoken import kernels
from freetoken.experts.memory.pool import ExpertSpec, PoolBuilder
from freetoken.kernels import huge_pages
from freetoken.kernels.huge_pages import HUGE_PAGE, huge_empty, on_huge_pages
from freetoken.kernels.pool import CpuPool
from freetoken.layers.linear import Linear

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def vm_flags(addr: int) -> list[str]:
    """The VmFlags of the mapping holding `addr` in /proc/self/smaps."""
    inside, lines = False, Path("/proc/self/smaps").read_text().splitlines()
    for line in lines:
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    return []


@pytest.mark.parametrize("shape", [(3, 1000, 700), (HUGE_PAGE // 2,), (5 * HUGE_PAGE // 4 + 3,)])
def test_huge_empty_is_torch_empty_on_an_advised_boundary(shape):
    t = huge_empty(shape, torch.bfloat16)
    assert t.shape == shape and t.dtype == torch.bfloat16 and t.is_contiguous()
    assert t.untyped_storage().nbytes() == t.nbytes
    assert t.data_ptr() % HUGE_PAGE == 0
    if THP.exists() and "[never]" not in THP.read_text():
        assert "hg" in vm_flags(t.data_ptr())
    view = t.view(-1)
    view.copy_(torch.arange(view.numel()).bfloat16())
    gc.collect()                    # the map lives as long as the tensor
    assert torch.equal(view[-5:], torch.arange(view.numel() - 5, view.numel()).bfloat16())


def test_small_tensors_stay_where_they_are():
    small = torch.randn(100, 100)
    assert on_huge_pages(small) is small
    assert huge_empty((10, 10), torch.float32).shape == (10, 10)


def test_on_huge_pages_is_an_exact_copy():
    t = torch.randn(1100, 1000).bfloat16()[:, 3:990]        # 2.2 MB, not contiguous: copied contiguous
    h = on_huge_pages(t)
    assert h.data_ptr() % HUGE_PAGE == 0 and h.is_contiguous() and torch.equal(h, t)


@pytest.mark.parametrize("isa", kernels.variants_here())
@pytest.mark.parametrize("bf16_dot", [0, 1])
@pytest.mark.parametrize("huge", [True, False])
def test_kernel_gemv_over_huge_page_weights_is_float64(isa, bf16_dot, huge):
    lib = kernels.load(isa)
    pool = CpuPool(lib, 2)
    lib.ft_set_bf16_dot(bf16_dot)
    huge_pages.ON[0] = huge         # off: torch.empty's memory, as bench/huge_pages.py --engine's base
    try:
        g = torch.Generator().manual_seed(38)
        w = torch.randn(1040, 1050, generator=g)        # 2.2 MB of bf16: on huge pages
        lin = Linear(w, None, compute_dtype=torch.float32, storage_dtype=torch.bfloat16, pool=pool)
        assert (lin.weight.data_ptr() % HUGE_PAGE == 0) or not huge
        x = torch.randn(3, 1050, generator=g)
        xr = x.bfloat16().double() if bf16_dot else x.double()
        for m in (1, 3):
            ref = xr[:m] @ w.bfloat16().double().T
            assert (lin(x[:m]).double() - ref).abs().max() / ref.abs().max() < 1e-5
    finally:
        huge_pages.ON[0] = True
        lib.ft_set_bf16_dot(0)
        pool.close()


def test_pool_banks_on_huge_pages_hold_the_experts():
    spec = ExpertSpec(hidden=512, intermediate=768)
    b = PoolBuilder(2, 4, spec)
    g = torch.Generator().manual_seed(1)
    layers = [torch.randn(4, 1536, 512, generator=g).bfloat16() for _ in range(2)]
    for layer, v in enumerate(layers):
        b.put_layer("gate_up", layer, v, torch.bfloat16)
    bank = b.build().banks["gate_up"]
    assert bank.data_ptr() % HUGE_PAGE == 0 and torch.equal(bank, torch.cat(layers))


def test_profile_banks_on_huge_pages_hold_the_expert():
    """`freetoken profile` measures B_H over banks on the pages the engine's banks are on: each of
    its experts a copy of the one random expert."""
    from freetoken.experts.measure.probe import synthetic_pool
    pool = synthetic_pool(512, 768, "bf16", 0.05)
    gu = pool.banks["gate_up"]
    assert gu.data_ptr() % HUGE_PAGE == 0 and gu.is_contiguous() and gu.shape[0] >= 16
    assert all(torch.equal(gu[i], gu[0]) for i in range(gu.shape[0]))
