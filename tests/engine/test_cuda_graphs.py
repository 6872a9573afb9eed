"""Decode CUDA graphs (engine/cuda_graphs.py): buckets, static buffers and padding on the CPU
with the eager "capture" (the same contract as the CUDA one), against eager decode of the
same batches through another runner; refusals; real capture/replay under `cuda`."""
from __future__ import annotations

import pytest
import torch

from freetoken.config import EngineConfig
from freetoken.engine.block_manager import BlockManager
from freetoken.config import check_cuda_graphs
from freetoken.engine.cuda_graphs import DecodeGraphs, buckets_for, eager_capture
from freetoken.engine.model_runner import ModelRunner
from freetoken.engine.sequence import Sequence
from freetoken.errors import InvalidRequestError
from freetoken.loading.loader import load_model
from freetoken.memory.resolve import resolve
from freetoken.sampling_params import SamplingParams

BS = 4
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class Side:
    """One model + KV cache + block manager; `graphs` turns the decode graphs on."""

    def __init__(self, path, device="cpu", graphs=None, max_len=64):
        cfg = EngineConfig(model=str(path), dtype="float32", moe_backend="resident", device=device)
        self.model, _ = load_model(cfg, resolve(cfg))
        if self.model.experts is not None:
            self.model.experts.sync_free = True         # what CUDA uses: the capturable executor
        self.blocks = BlockManager(128, BS)
        spec = None if graphs is None else {"max_batch": graphs, "max_model_len": max_len,
                                            **({"capture": eager_capture} if device == "cpu" else {})}
        self.runner = ModelRunner(self.model, 128, BS, spec)
        self.seqs: list[Sequence] = []

    def add(self, ids: list[int], prompt: int) -> None:
        s = Sequence(f"s{len(self.seqs)}", ids, SamplingParams(), None, 0)
        self.blocks.allocate(s, prompt)
        self.runner.run([(s, prompt)])
        s.num_computed = prompt
        self.seqs.append(s)

    def close(self) -> None:
        """Torch's threads back (a decode step left them at one) and the experts closed."""
        self.runner.idle()
        if self.model.experts is not None:
            self.model.experts.close()

    def decode(self, which: list[int]) -> torch.Tensor:
        batch = [self.seqs[i] for i in which]
        for s in batch:
            self.blocks.allocate(s, s.num_computed + 1)
        logits = self.runner.run([(s, 1) for s in batch])[0]
        for s in batch:
            s.num_computed += 1
        return logits.float().cpu()


@pytest.fixture
def sides():
    """sides(path, ...) -> a Side, closed after the test (a runner left mid-decode keeps torch at one thread)."""
    made: list[Side] = []
    yield lambda *a, **kw: made.append(Side(*a, **kw)) or made[-1]
    for side in made:
        side.close()


def sequences(vocab: int, n: int, length: int):
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, vocab, (length,), generator=g).tolist() for _ in range(n)]


def test_buckets():
    assert buckets_for(1) == [1]
    assert buckets_for(5) == [1, 2, 4, 5]
    assert buckets_for(16) == [1, 2, 4, 8, 16]
    g = DecodeGraphs(lambda st: None, 6, 8, torch.device("cpu"), eager_capture)
    assert [g.bucket(b) for b in range(1, 8)] == [1, 2, 4, 4, 6, 6, None]


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral", "deepseek_v3"])
def test_graph_decode_equals_eager_for_every_batch_size(tiny_dir, sides, arch):
    """Batches of 1..N (and one of N+1, outside the buckets: eager) decode the same logits with
    graphs as without, padding rows included; each bucket is captured once and replayed."""
    path = tiny_dir(arch)
    N = 5
    eager, graphed = sides(path), sides(path, graphs=N)
    vocab = eager.model.vocab_size
    for ids in sequences(vocab, N + 1, 40):
        prompt = 3 + len(eager.seqs) * 2                   # ragged lengths
        eager.add(ids, prompt)
        graphed.add(ids, prompt)
    schedule = [[0], [0, 1], [2, 1, 0], [0, 1, 2, 3], [4, 3, 2, 1, 0], [1, 3], [0, 1, 2, 3, 4, 5], [5], [2, 4, 0]]
    for which in schedule:
        ref, got = eager.decode(which), graphed.decode(which)
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    g = graphed.runner.graphs
    assert sorted(g.graphs) == [1, 2, 4, 5]                 # captured once per bucket used
    assert g.replays == len(schedule) - 1                    # the batch of 6 ran eagerly
    assert g.disabled is None


def test_static_step_has_no_host_sync(tiny_dir, sides, monkeypatch):
    """What a graph captures reads no device data on the host (counted per op): the gathered
    attention path, and the paged one CUDA takes up to its fused kernel (the block tables and
    the block mask; the kernel itself, a compiled HOP, is replaced by zeros for the count)."""
    from freetoken.layers.attention.paged import paged_flex
    from helpers import CountHostSyncs
    side = sides(tiny_dir("qwen3_moe"), graphs=4)
    vocab = side.model.vocab_size
    for ids in sequences(vocab, 3, 20):
        side.add(ids, 6)
    side.decode([0, 1, 2])                                   # captures bucket 4
    st = side.runner.graphs.static[4]
    want = side.runner.graphs.graphs[4][1][:3]
    with torch.inference_mode(), CountHostSyncs() as mode:
        got = side.runner._static_step(st, False)
    assert mode.ops == [], mode.ops
    torch.testing.assert_close(got[:3], want, rtol=1e-4, atol=1e-4)

    def kernel_zeros(q, k, v, **kw):
        return torch.zeros(*q.shape[:3], v.shape[-1]), torch.zeros(q.shape[:3])
    monkeypatch.setattr(paged_flex, "_kernel", lambda device: kernel_zeros)
    with torch.inference_mode(), CountHostSyncs() as mode:
        side.runner._static_step(st, True)
    assert mode.ops == [], mode.ops


def test_kv_resize_drops_the_graphs(tiny_dir, sides):
    side = sides(tiny_dir("mixtral"), graphs=2)
    for ids in sequences(side.model.vocab_size, 1, 20):
        side.add(ids, 5)
    side.decode([0])
    assert side.runner.graphs.graphs
    side.runner.resize_kv(128, {})
    assert not side.runner.graphs.graphs


def test_refusals_are_one_line():
    cpu = torch.device("cpu")
    with pytest.raises(InvalidRequestError, match="cuda_graphs: needs a CUDA device"):
        check_cuda_graphs(cpu, "resident", None, False)
    dev = torch.device("cuda")
    for backend in ("hybrid", "offload", "cpu"):
        with pytest.raises(InvalidRequestError, match=f"moe_backend {backend}"):
            check_cuda_graphs(dev, backend, None, False)
    with pytest.raises(InvalidRequestError, match="disk expert tier"):
        check_cuda_graphs(dev, "resident", "disk", False)
    with pytest.raises(InvalidRequestError, match="recurrent state"):
        check_cuda_graphs(dev, "resident", None, True)
    check_cuda_graphs(dev, "resident", None, False)
    check_cuda_graphs(dev, None, None, False)                  # no experts (dense model)
    if not torch.cuda.is_available():
        with pytest.raises(InvalidRequestError, match="needs a CUDA device") as e:
            EngineConfig(model="x", cuda_graphs=True)
        assert "\n" not in str(e.value)


def test_cli_flag_reaches_the_config():
    import argparse

    from freetoken.engine.args import add_engine_args, engine_options
    p = argparse.ArgumentParser()
    add_engine_args(p)
    assert engine_options(p.parse_args(["--cuda-graphs"]))["cuda_graphs"] is True
    assert engine_options(p.parse_args([]))["cuda_graphs"] is False


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral", "deepseek_v3"])
def test_cuda_graph_capture_and_replay_equal_eager(tiny_dir, sides, arch):
    path = tiny_dir(arch)
    N = 4
    eager, graphed = sides(path, "cuda"), sides(path, "cuda", graphs=N)
    for ids in sequences(eager.model.vocab_size, N, 40):
        prompt = 4 + len(eager.seqs) * 3
        eager.add(ids, prompt)
        graphed.add(ids, prompt)
    for which in ([0], [0, 1], [0, 1, 2], [3, 2, 1, 0], [1], [0, 2]):
        torch.testing.assert_close(graphed.decode(which), eager.decode(which), rtol=1e-3, atol=1e-3)
    g = graphed.runner.graphs
    assert g.disabled is None and sorted(g.graphs) == [1, 2, 4] and g.replays == 6


@pytest.mark.cuda
@cuda
def test_cuda_graphs_turn_off_on_a_step_that_syncs():
    """A step reading device data on the host is not captured: one warning, eager from then on."""
    def step(st):
        return st.ids.float() * float(st.ids.sum())          # .item(): a host sync
    g = DecodeGraphs(step, 2, 4, torch.device("cuda"))
    out = g.run(torch.tensor([1]), torch.tensor([0]), torch.tensor([4]), torch.tensor([[4]]))
    assert out is None and g.disabled
