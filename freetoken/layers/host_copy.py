"""State snapshots in host memory: the prefix cache budgets checkpoints (`state_cache_gib`) as
host memory, so a snapshot of a state living on a GPU must not stay in VRAM.

`to_host` copies a group of tensors into one host buffer (pinned when the source is on a CUDA
device and pinning works, so the device->host copies are asynchronous DMA), each tensor a view
at a 64-byte aligned offset (one host allocation per snapshot). The copies are queued on the
current stream with `non_blocking=True`, followed by an event: the step goes on while they run,
and `HostCopy.wait()` is only needed before the host itself reads the bytes. `copy_back` queues
the host->device copies on the current stream after that event. On CPU tensors the same code
runs (a pageable buffer, plain copies, no event).

Pinned buffers come from PyTorch's caching host allocator (freed buffers are reused; it may
round an allocation up: the memory plan counts that, not this module)."""
from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)
ALIGN = 64
_pin_failed = False       # pinning refused once (ulimit -l, WSL limits): pageable from then on


def _host_buffer(nbytes: int, pin: bool) -> torch.Tensor:
    global _pin_failed
    if pin and not _pin_failed:
        try:
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        except RuntimeError as e:
            _pin_failed = True
            log.warning("state checkpoints: pinned host memory refused (%s); using pageable memory "
                        "(device<->host copies of checkpoints become synchronous)", e)
    return torch.empty(nbytes, dtype=torch.uint8)


class HostCopy:
    """Host copies of some tensors (`tensors`, in order) and the event that says they landed."""

    def __init__(self, tensors: list[torch.Tensor], event=None):
        self.tensors, self.event = tensors, event

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()

    def copy_back(self, live: list[torch.Tensor]) -> None:
        """Queue host -> live-device copies (stream-ordered after the snapshot's own copies)."""
        if self.event is not None and live and live[0].device.type == "cuda":
            torch.cuda.current_stream(live[0].device).wait_event(self.event)
        for dst, src in zip(live, self.tensors):
            dst.copy_(src, non_blocking=src.is_pinned())


def to_host(tensors: list[torch.Tensor]) -> HostCopy:
    """Asynchronous copies of `tensors` into one host buffer (see the module doc)."""
    cuda = [t for t in tensors if t.device.type == "cuda"]
    offsets, total = [], 0
    for t in tensors:
        offsets.append(total)
        total += -(-t.nbytes // ALIGN) * ALIGN
    buf = _host_buffer(max(total, 1), pin=bool(cuda))
    pinned = buf.is_pinned() if cuda else False
    out = []
    for t, off in zip(tensors, offsets):
        host = buf[off:off + t.nbytes].view(t.dtype).view(t.shape)
        host.copy_(t, non_blocking=pinned)
        out.append(host)
    event = None
    if cuda:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(cuda[0].device))
    return HostCopy(out, event)
