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


@pytest.mark.parametrize("arch", ["qwen3_next", "gpt_oss", "glm5_next", "deepseek_v4"])
def test_snapshot_parts_are_the_host_buffers_a_snapshot_takes(tiny_dir, arch):
    """The plan's per-part snapshot sizes (the pinned blocks it rounds on CUDA) are the host
    buffers `snapshot()` really allocates, one a part (layers/host_copy.py)."""
    from freetoken.memory.model_size import read_model_shape
    from freetoken.memory.plan import snapshot_parts
    from freetoken.config import EngineConfig
    src = tiny_dir(arch, max_position_embeddings=4096)
    llm = LLM(str(src), dtype="bfloat16", max_num_seqs=1, max_model_len=MAX_LEN)
    try:
        snap = llm.engine.model.make_state().snapshot()
        buffers = [p.host.tensors[0].untyped_storage().nbytes() for p in snap.parts.values()]
        want = snapshot_parts(read_model_shape(src), EngineConfig(model=str(src), dtype="bfloat16"))
        if arch == "deepseek_v4":       # a compressor's snapshot holds its entries so far: none yet
            assert sum(buffers) <= sum(want)
        else:
            assert tuple(buffers) == want
    finally:
        llm.close()
