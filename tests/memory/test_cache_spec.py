"""The memory plan sizes what the engine allocates: for every architecture `make-tiny` knows,
the plan's KV cache and sequence states for N sequences of L tokens equal the bytes of the
tensors the engine holds for them (KV pool, and one `make_state()` per sequence), measured on
the allocated tensors. The plan asks the model class (models/cache_spec.py), never a copy of
its rules."""
import pytest
import torch

from freetoken import LLM
from freetoken.tiny import ARCHS

N_SEQS, MAX_LEN = 3, 160


def tensor_bytes(obj, seen=None) -> int:
    """Bytes of every tensor reachable from obj's attributes (dicts and lists followed)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return obj.untyped_storage().nbytes()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dict__"):
        return sum(tensor_bytes(v, seen) for v in vars(obj).values())
    return 0


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_plan_equals_allocation(tiny_dir, arch):
    src = tiny_dir(arch, max_position_embeddings=4096)
    llm = LLM(str(src), dtype="bfloat16", max_num_seqs=N_SEQS, max_model_len=MAX_LEN)
    try:
        eng = llm.engine
        items = {i.name: i.nbytes for i in eng.memory_plan.items}
        kv = sum(tensor_bytes(c) for c in eng.runner.kv.values())
        assert items.get("KV cache", 0) == pytest.approx(kv, rel=0.05, abs=0), arch
        states = N_SEQS * tensor_bytes(eng.model.make_state())
        assert items.get("sequence states", 0) == pytest.approx(states, rel=0.05, abs=0), arch
    finally:
        llm.close()
