"""The disk tier's layer 0 kept in the host cache (backend.KEEP_FIRST, `SlotTable.keep`) and the
kernel pool parked while a layer call waits on a read (backend.PARK, `CpuPool.park`): both move
only which bytes are read and who sleeps, so the logits and tokens are the resident pool's bit
for bit, on and off, with reads delayed by drawn amounts (they land in any order); parking
happens exactly when a call waits."""
from __future__ import annotations

import pytest
import torch

from freetoken import LLM
from tiered_helpers import outputs_hold_under_delayed_reads, resident_ftw


@pytest.fixture(scope="module")
def ftw(tiny_dir, tmp_path_factory):
    return resident_ftw(tiny_dir, tmp_path_factory.mktemp("kp"))


@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("park", [True, False])
@pytest.mark.parametrize("share", [0.3, 0.8])
def test_tokens_identical_kept_first_layer_and_parked_pool(ftw, keep, park, share, monkeypatch):
    from freetoken.experts.disk import backend
    monkeypatch.setattr(backend, "KEEP_FIRST", keep)
    monkeypatch.setattr(backend, "PARK", park)
    path, (logits, tokens) = ftw
    probe = LLM(str(path), dtype="float32", host_cache_slots=1, prefix_cache=False)
    n = probe.engine.model.experts.layout.num_layers * probe.engine.model.experts.E
    probe.close()
    llm = LLM(str(path), dtype="float32", host_cache_slots=max(2, int(share * n)), prefix_cache=False)
    experts = llm.engine.model.experts
    table = experts.cache.table
    assert table.keep_layers == ((0,) if keep else ())
    parked = []
    if experts.cache.on_block is not None:
        hook = experts.cache.on_block
        experts.cache.on_block = lambda: (parked.append(1), hook())
    assert (experts.cache.on_block is not None) == park
    try:
        outputs_hold_under_delayed_reads(llm, (logits, tokens), [0.0, 0.001, 0.003], examples=4, keys=8)
        assert (len(parked) > 0) == (park and experts.cache.read_s > 0)
    finally:
        llm.close()
