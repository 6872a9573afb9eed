"""State checkpoints live in host memory (the plan budgets them there), copied asynchronously
from a GPU and restored to the live device. The same code runs on CPU tensors here and on
CUDA in the `cuda` tests."""
import pytest
import torch

from freetoken.layers import host_copy
from freetoken.layers.state import DeltaNetState, SequenceState, SlidingWindowKV


def _filled(device):
    g = torch.Generator().manual_seed(0)
    st = SequenceState({"dn": DeltaNetState(3, (6, 3), (2, 4, 5), dtype=torch.bfloat16, device=device),
                        "win": SlidingWindowKV(2, 4, 2, 3, device=device, values=False)})
    for p in st.parts.values():
        for t in p.tensors:
            live = getattr(p, t)
            live.copy_(torch.randn(live.shape, generator=g).to(live.dtype))
    st.advance(9)
    return st


def _check_round_trip(device):
    st = _filled(device)
    before = {(n, t): getattr(p, t).clone() for n, p in st.parts.items() for t in p.tensors}
    snap = st.snapshot()
    for (n, t), want in before.items():
        got = getattr(snap.parts[n], t)
        assert got.device.type == "cpu"
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.data_ptr() != getattr(st.parts[n], t).data_ptr()
        torch.testing.assert_close(got, want.cpu(), rtol=0, atol=0)
    assert snap.nbytes == st.nbytes and snap.position == 9
    for p in st.parts.values():          # the live state moves on; the checkpoint does not
        for t in p.tensors:
            getattr(p, t).add_(1)
    for (n, t), want in before.items():
        torch.testing.assert_close(getattr(snap.parts[n], t), want.cpu(), rtol=0, atol=0)
    st.restore(snap)
    for (n, t), want in before.items():
        live = getattr(st.parts[n], t)
        assert live.device == want.device
        torch.testing.assert_close(live, want, rtol=0, atol=0)
    return snap


def test_checkpoint_lives_in_host_memory_and_restores_exactly():
    _check_round_trip("cpu")


def test_one_host_buffer_per_snapshot_at_aligned_offsets():
    st = _filled("cpu").parts["dn"]
    snap = st.snapshot()
    conv, rec = snap.host.tensors
    assert conv.untyped_storage().data_ptr() == rec.untyped_storage().data_ptr()
    assert (rec.data_ptr() - conv.data_ptr()) % 64 == 0 and rec.data_ptr() - conv.data_ptr() >= conv.nbytes
    assert snap.host.event is None          # no device: plain copies, nothing to wait for
    snap.host.wait()


def test_pin_refusal_falls_back_to_pageable_once(monkeypatch, caplog):
    calls = []

    def empty(*shape, pin_memory=False, **kw):
        calls.append(pin_memory)
        if pin_memory:
            raise RuntimeError("cudaHostAlloc failed: ulimit -l")
        return torch.zeros(*shape, **kw)

    monkeypatch.setattr(host_copy, "_pin_failed", False)
    monkeypatch.setattr(host_copy.torch, "empty", empty)
    with caplog.at_level("WARNING"):
        a = host_copy._host_buffer(128, pin=True)
        b = host_copy._host_buffer(128, pin=True)
    assert calls == [True, False, False] and a.numel() == b.numel() == 128
    assert sum("pinned host memory refused" in r.message for r in caplog.records) == 1


@pytest.mark.cuda
def test_cuda_checkpoint_is_pinned_host_memory_not_vram():
    snap = _check_round_trip("cuda")
    for p in snap.parts.values():
        for t in p.tensors:
            assert getattr(p, t).is_pinned()
        assert p.host.event is not None


@pytest.mark.cuda
def test_cuda_snapshot_allocates_no_device_memory_and_is_asynchronous():
    st = DeltaNetState(8, (256, 3), (16, 128, 128), device="cuda")   # 8 MiB of recurrent state
    st.rec.normal_()
    torch.cuda.synchronize()
    used = torch.cuda.memory_allocated()
    snap = st.snapshot()
    assert torch.cuda.memory_allocated() == used
    snap.host.wait()                       # the event orders the host's read after the DMA
    torch.testing.assert_close(snap.rec, st.rec.cpu(), rtol=0, atol=0)
    st.rec.zero_()
    st.restore(snap)                       # queued on the current stream, no host sync needed
    torch.testing.assert_close(st.rec, snap.rec.cuda(), rtol=0, atol=0)


@pytest.mark.cuda
def test_cuda_restore_on_another_stream_waits_for_the_snapshot():
    st = DeltaNetState(4, (64, 3), (8, 64, 64), device="cuda")
    st.rec.normal_()
    want = st.rec.clone()
    snap = st.snapshot()
    st.rec.zero_()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        st.restore(snap)
    side.synchronize()
    torch.testing.assert_close(st.rec, want, rtol=0, atol=0)
