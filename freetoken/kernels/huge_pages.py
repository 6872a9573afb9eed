"""Memory for the weights the decode kernels stream, on 2 MiB pages (Linux transparent huge pages).

Why: a decode step streams every weight it touches once from DRAM. Over 4 KiB pages each page
costs a TLB fill and the core's hardware prefetchers stop at every page boundary. llama.cpp's
weights, mapped from the GGUF file in the page cache, sit on 2 MiB pages (its process shows the
file as `FilePmdMapped`); ours, torch memory under the default THP mode `madvise`, sat on 4 KiB
ones. On the Zen 4 of issue 38 one thread streaming bf16 rows with vdpbf16ps read 24.7 -> 30.7
GB/s, and the medium model's decode step ran 1.07x faster (docs/benchmarks.md, issue 38).

The memory is a fresh private anonymous map marked `MADV_HUGEPAGE` before anything touches it,
so its first writes fault in huge pages (moving filled pages later, `MADV_COLLAPSE`, measured
~0.2 GB/s: 15 s for the medium model's 3.2 GB). Where THP is off or the map fails, the pages are
the small ones torch's own allocation would have given: the same bytes, only slower."""
from __future__ import annotations

import mmap

import torch

HUGE_PAGE = 2 << 20
# bench/huge_pages.py --engine builds one engine with this off (torch.empty's pages) beside one with it on
ON = [True]


def huge_empty(shape, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised contiguous tensor starting on a 2 MiB boundary of memory marked for huge
    pages; torch.empty where it is smaller than one huge page or THP is not offered. The tensor
    keeps its map alive (torch.frombuffer holds the buffer)."""
    numel = 1
    for n in shape:
        numel *= int(n)
    nbytes = numel * torch.empty(0, dtype=dtype).element_size()
    if nbytes < HUGE_PAGE or not ON[0] or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(shape, dtype=dtype)
    mm = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE)    # (anonymous)
    offset = -torch.frombuffer(mm, dtype=torch.uint8, count=1).data_ptr() % HUGE_PAGE
    try:    # the whole huge pages only: a tail on one would hold up to 2 MiB more per tensor
        mm.madvise(mmap.MADV_HUGEPAGE, offset, nbytes // HUGE_PAGE * HUGE_PAGE)
    except OSError:             # THP not offered by this kernel: small pages
        pass
    return torch.frombuffer(mm, dtype=dtype, count=numel, offset=offset).view(tuple(shape))


def on_huge_pages(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`t` as `dtype` (default its own) copied onto huge_empty memory (contiguous), converted in
    that one copy; `t.to(dtype).contiguous()` where smaller than a huge page (or huge pages are off)."""
    dtype = t.dtype if dtype is None else dtype
    if t.numel() * dtype.itemsize < HUGE_PAGE or not ON[0] or t.device.type != "cpu":
        return t.to(dtype).contiguous()
    out = huge_empty(t.shape, dtype)
    out.copy_(t)
    return out
