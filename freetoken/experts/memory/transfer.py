"""Copy engines: how expert rows travel from the host pool into cache slots.

One job = a list of (dst, src) row copies issued together. Jobs run in submission
order (one link), so waiting on a job also means every earlier job has landed.

  CudaCopyEngine    a dedicated copy stream; the copy stream first waits for the
                    compute stream (a slot being refilled may still be read by
                    queued kernels), and compute waits on the job's event before
                    reading the new rows.
  ThreadCopyEngine  one background thread doing real memcpy (torch releases the
                    GIL), used when the cache tier is host memory.
  PageableCudaCopyEngine  pageable host banks (pinning refused): the copies run on a
                    thread and its own stream, since a copy from pageable memory blocks
                    the calling thread while the driver stages it.
  PacedCopyEngine   ThreadCopyEngine whose link runs no faster than `bytes_per_s`:
                    emulates a PCIe link of a chosen speed (benchmarks, tests).
  SyncCopyEngine    copies inline; the simplest correct engine.
"""
from __future__ import annotations

import queue
import threading
import time

import torch

Pairs = list[tuple[torch.Tensor, torch.Tensor]]


class CopyJob:
    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.seconds: float | None = None      # link time of this job, once known
        self._done = threading.Event()
        self.error: BaseException | None = None

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> None:
        self._done.wait()
        if self.error is not None:
            raise self.error

    def finish(self, seconds: float, error: BaseException | None = None) -> None:
        self.seconds, self.error = seconds, error
        self._done.set()


class CopyEngine:
    def submit(self, pairs: Pairs, nbytes: int) -> CopyJob:
        raise NotImplementedError

    def device_wait(self, job: CopyJob) -> None:
        """Make later device work wait for `job` (host-side wait where there is no stream)."""
        job.wait()

    def close(self) -> None:
        pass


def _copy_all(pairs: Pairs) -> None:
    for dst, src in pairs:
        dst.copy_(src)


class SyncCopyEngine(CopyEngine):
    def submit(self, pairs, nbytes):
        job = CopyJob(nbytes)
        t0 = time.perf_counter()
        _copy_all(pairs)
        job.finish(time.perf_counter() - t0)
        return job


class ThreadCopyEngine(CopyEngine):
    def __init__(self, bytes_per_s: float | None = None):
        self.bytes_per_s = bytes_per_s
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="freetoken-copy", daemon=True)
        self._thread.start()

    def submit(self, pairs, nbytes):
        job = CopyJob(nbytes)
        self._q.put((job, pairs))
        return job

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            job, pairs = item
            t0 = time.perf_counter()
            try:
                self._copy(pairs)
                if self.bytes_per_s:
                    left = t0 + job.nbytes / self.bytes_per_s - time.perf_counter()
                    if left > 0:
                        time.sleep(left)
                job.finish(time.perf_counter() - t0)
            except BaseException as e:  # surfaced to the waiter
                job.finish(time.perf_counter() - t0, e)

    def _copy(self, pairs) -> None:
        _copy_all(pairs)

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=5)


class PageableCudaCopyEngine(ThreadCopyEngine):
    """Fills from pageable host banks into CUDA slots, off the decode thread. A job is done
    once its stream has finished (the tiered backend only uses background fills then)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        super().__init__()

    def submit(self, pairs, nbytes):
        # slots being overwritten may still be read by kernels queued on the compute stream
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.device))
        return super().submit((ev, pairs), nbytes)

    def _copy(self, item) -> None:
        ev, pairs = item
        self.stream.wait_event(ev)
        with torch.cuda.stream(self.stream):
            _copy_all(pairs)
        self.stream.synchronize()


class PacedCopyEngine(ThreadCopyEngine):
    """A copy thread whose link is no faster than `bytes_per_s` (an emulated PCIe link)."""

    def __init__(self, bytes_per_s: float):
        super().__init__(bytes_per_s)


class _CudaJob(CopyJob):
    def __init__(self, nbytes, start, end):
        super().__init__(nbytes)
        self.start, self.end = start, end

    def done(self) -> bool:
        if not self._done.is_set() and self.end.query():
            self.finish(self.start.elapsed_time(self.end) / 1e3)
        return self._done.is_set()

    def wait(self) -> None:
        self.end.synchronize()
        self.done()


class CudaCopyEngine(CopyEngine):
    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device=device)

    def submit(self, pairs, nbytes):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        # Slots being overwritten may still be read by kernels queued on the compute stream.
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            start.record()
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
            end.record()
        return _CudaJob(nbytes, start, end)

    def device_wait(self, job):
        torch.cuda.current_stream(self.device).wait_event(job.end)


def make_copy_engine(device: torch.device, link_bytes_per_s: float | None = None,
                     pinned: bool = True) -> CopyEngine:
    """pinned: whether the pool's banks are page-locked (CUDA: async copies on a stream)."""
    if device.type == "cuda" and link_bytes_per_s is None:
        return CudaCopyEngine(device) if pinned else PageableCudaCopyEngine(device)
    return ThreadCopyEngine(link_bytes_per_s)
