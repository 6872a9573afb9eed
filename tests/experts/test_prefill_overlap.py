"""Prefill double buffering overlaps: layer l+1's expert copy is issued before layer l's
attention (the first two layers' at the step start), and the answer is unchanged."""
import pytest
import torch
from tiered_helpers import one_torch_thread  # noqa: F401

from freetoken import LLM
from freetoken.experts.memory.transfer import CopyEngine, make_copy_engine


class RecordingCopyEngine(CopyEngine):
    """Any copy engine, logging ("copy", moe layer) for every job in submission order."""

    def __init__(self, inner: CopyEngine, pool, events: list):
        self.inner, self.pool, self.events = inner, pool, events

    def _layers(self, pairs) -> list[int]:
        out = set()
        for _, src in pairs:
            for bank in self.pool.banks.values():
                row = bank[0].nbytes
                off = src.data_ptr() - bank.data_ptr()
                if 0 <= off < bank.nbytes:
                    out.add(off // row // self.pool.num_experts)
        return sorted(out)

    def submit(self, pairs, nbytes):
        self.events += [("copy", layer) for layer in self._layers(pairs)]
        return self.inner.submit(pairs, nbytes)

    def device_wait(self, job):
        self.inner.device_wait(job)

    def close(self):
        self.inner.close()


class RecordingAttention:
    def __init__(self, inner, moe_layer: int, events: list):
        self.inner, self.moe_layer, self.events = inner, moe_layer, events

    def __call__(self, *args, **kw):
        self.events.append(("attn", self.moe_layer))
        return self.inner(*args, **kw)


def _record(llm, events):
    model = llm.engine.model
    tiered = model.experts
    tiered.cache.copy = RecordingCopyEngine(tiered.cache.copy, tiered.pool, events)
    for i, layer in enumerate(model.layers):
        layer.attn = RecordingAttention(layer.attn, model.moe_layers.index(i), events)


def _check_order(events, num_layers):
    first_copy = {}
    for i, (kind, layer) in enumerate(events):
        if kind == "copy":
            first_copy.setdefault(layer, i)
    attn_at = {layer: i for i, (kind, layer) in enumerate(events) if kind == "attn"}
    assert attn_at and set(first_copy) == set(range(num_layers)), events
    assert first_copy[0] < attn_at[0] and first_copy[1] < attn_at[0], events       # at the step start
    for layer in range(1, num_layers - 1):
        assert first_copy[layer + 1] < attn_at[layer], (layer, events)          # before l's attention


def _run(model_dir, device, stream_prompt):
    events = []
    llm = LLM(str(model_dir), dtype="float32", moe_backend="offload", expert_cache_slots=16, device=device)
    try:
        llm.score(list(range(100, 140)))            # the backend learns the top-k (first prefill)
        _record(llm, events)
        events.clear()
        logits = llm.score(stream_prompt)            # fresh tokens: no prefix-cache hit
        stats = llm.expert_stats()["total"]
    finally:
        llm.close()
    return events, logits, stats


@pytest.fixture(scope="module")
def model(tiny_dir):
    return tiny_dir("qwen3_moe", layers=4, experts=8, top_k=2)


PROMPT = list(range(5, 45))


def test_next_layers_copy_is_issued_before_this_layers_attention(model):
    events, logits, stats = _run(model, "cpu", PROMPT)
    assert stats["streamed_layers"] >= 4
    _check_order(events, 4)
    ref = LLM(str(model), dtype="float32", moe_backend="resident")
    try:
        torch.testing.assert_close(logits, ref.score(PROMPT), atol=1e-4, rtol=1e-4)
    finally:
        ref.close()


def test_short_prefill_does_not_start_layer_copies(model):
    """Under 2*E routed pairs the layer fills on demand: nothing is copied at the step start."""
    events, _, stats = _run(model, "cpu", [7, 8, 9])
    kinds = [k for k, _ in events]
    assert kinds[0] == "attn"
    assert stats["streamed_layers"] == 4          # the warm-up prompt's four layers, none of this one


@pytest.mark.cuda
def test_cuda_prefill_overlap_with_real_streams_and_events(model):
    """The CUDA copy engine (copy stream, events): same issue order, same answer as the CPU."""
    events, logits, stats = _run(model, "cuda", PROMPT)
    assert stats["streamed_layers"] >= 4
    _check_order(events, 4)
    ref = LLM(str(model), dtype="float32", moe_backend="resident")
    try:
        torch.testing.assert_close(logits.cpu(), ref.score(PROMPT), atol=1e-4, rtol=1e-4)
    finally:
        ref.close()


@pytest.mark.cuda
def test_cuda_copy_stream_waits_for_queued_reads_of_reused_slots():
    """A slot refilled on the copy stream is not overwritten while the compute stream still reads it."""
    dev = torch.device("cuda")
    engine = make_copy_engine(dev)
    slot = torch.ones(1 << 22, device=dev)
    src = torch.full((1 << 22,), 2.0).pin_memory()
    reads = [slot.sum() for _ in range(8)]                 # queued on the compute stream
    job = engine.submit([(slot, src)], src.nbytes)
    engine.device_wait(job)
    after = slot.sum()
    assert all(r.item() == float(1 << 22) for r in reads) and after.item() == 2.0 * (1 << 22)
    job.wait()
    assert job.seconds is not None and job.seconds > 0
    engine.close()
